package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// esc makes untrusted text safe for one line of a terminal: control
// characters (tab, newline and ESC included, so no escape sequence reaches
// the terminal), bidirectional-text overrides and invalid UTF-8 are written
// as Go-style escapes.
func esc(s string) string { return escape(s, false) }

// escBlock is esc for multi-line text: newlines and tabs are kept.
func escBlock(s string) string { return escape(s, true) }

func escape(s string, block bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unsafeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case block && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case unsafeRune(r):
			q := strconv.QuoteRuneToASCII(r) // '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func unsafeRune(r rune) bool {
	if unicode.IsControl(r) { // C0, DEL, C1 (CSI is U+009B)
		return true
	}
	switch {
	case r == 0x061C, r == 0x200E, r == 0x200F, r >= 0x202A && r <= 0x202E, r >= 0x2066 && r <= 0x2069:
		return true // bidi controls: text that reads differently from what it is
	}
	return false
}

// oneLine is esc cut to n runes.
func oneLine(s string, n int) string {
	s = esc(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// The -json documents. Fields are only ever added.

type jsonQueue struct {
	Queue        string  `json:"queue"`
	Ready        int64   `json:"ready"`
	Delayed      int64   `json:"delayed"`
	InFlight     int64   `json:"in_flight"`
	DeadLettered int64   `json:"dead_lettered"`
	OldestAgeSec float64 `json:"oldest_age_seconds"`
}

type jsonStats struct {
	Time   time.Time   `json:"time"`
	Queues []jsonQueue `json:"queues"`
}

type jsonDeadLetter struct {
	Reason       string `json:"reason"`
	Class        string `json:"class"`
	Attempts     int    `json:"attempts"`
	Queue        string `json:"queue,omitempty"`
	FirstFailure string `json:"first_failure,omitempty"`
	LastFailure  string `json:"last_failure,omitempty"`
	RedriveCount int    `json:"redrive_count"`
}

type jsonMessage struct {
	ID             string            `json:"id"`
	Type           string            `json:"type"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Key            string            `json:"key,omitempty"`
	CorrelationID  string            `json:"correlation_id,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
	Body           string            `json:"body"`
	BodyEncoding   string            `json:"body_encoding"` // "text" (UTF-8) or "base64"
	DeadLetter     jsonDeadLetter    `json:"dead_letter"`
}

func toJSON(m *sdk.Message) jsonMessage {
	j := jsonMessage{ID: m.ID, Type: m.Type, IdempotencyKey: m.IdempotencyKey, Key: m.Key, CorrelationID: m.CorrelationID,
		Headers: m.Headers, Body: string(m.Body), BodyEncoding: "text", DeadLetter: history(m)}
	if !utf8.Valid(m.Body) {
		j.Body, j.BodyEncoding = base64.StdEncoding.EncodeToString(m.Body), "base64"
	}
	return j
}

func history(m *sdk.Message) jsonDeadLetter {
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	return jsonDeadLetter{
		Reason: m.Header(sdk.HeaderDeadLetterReason), Class: m.Header(sdk.HeaderDeadLetterClass),
		Attempts: atoi(m.Header(sdk.HeaderDeadLetterAttempts)), Queue: m.Header(sdk.HeaderDeadLetterQueue),
		FirstFailure: m.Header(sdk.HeaderFirstFailure), LastFailure: m.Header(sdk.HeaderLastFailure),
		RedriveCount: atoi(m.Header(sdk.HeaderRedriveCount)),
	}
}

type jsonList struct {
	Queue            string        `json:"queue"`
	TotalDeadLetters *int64        `json:"total_dead_letters"` // null when the broker cannot count them
	Matched          int           `json:"matched"`            // every matching dead letter, not just this page
	Complete         bool          `json:"complete"`           // false: the broker could not be scanned to the end; matched is a lower bound
	Offset           int           `json:"offset"`
	Limit            int           `json:"limit"`
	NextOffset       *int          `json:"next_offset"` // null on the last page
	Messages         []jsonMessage `json:"messages"`
}

type jsonFailure struct {
	ID    string `json:"id"`
	Error string `json:"error"`
}

type jsonChange struct {
	Action      string        `json:"action"` // "redrive" or "purge"
	Queue       string        `json:"queue"`
	DryRun      bool          `json:"dry_run"`
	Matched     int           `json:"matched"`
	Done        int           `json:"done"`
	Missed      int           `json:"missed"`
	Complete    bool          `json:"complete"`
	Interrupted bool          `json:"interrupted"`
	Failed      []jsonFailure `json:"failed"`
	Messages    []jsonMessage `json:"messages,omitempty"` // -dry-run: the first of them
}

func failures(fs []dlq.Failure) []jsonFailure {
	out := make([]jsonFailure, 0, len(fs))
	for _, f := range fs {
		out = append(out, jsonFailure{ID: f.ID, Error: f.Err.Error()})
	}
	return out
}
