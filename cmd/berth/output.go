package main

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"time"
	"unicode/utf8"

	"github.com/berthq/berth/internal/dlq"
)

// esc makes untrusted text safe for one line of a terminal (see
// dlq.EscapeText).
func esc(s string) string { return dlq.EscapeText(s, false) }

// errText makes the text of an error safe for one line of a terminal (see
// dlq.EscapeErrorText): what it names was escaped once where the error was
// made (esc in this package, Go quoting in the others), so its backslashes
// are left as they are, and what is still raw in it is escaped.
func errText(err error) string { return dlq.EscapeErrorText(err.Error()) }

// escBlock is esc for multi-line text: newlines and tabs are kept.
func escBlock(s string) string { return dlq.EscapeText(s, true) }

// oneLine is esc cut to n runes, between whole escapes (see
// dlq.EscapeTextShort).
func oneLine(s string, n int) string { return dlq.EscapeTextShort(s, n) }

// idWidth bounds the ID column of a table, in runes, as the dashboard's: a
// tabwriter pads each row to its column's widest cell, so one forged 200 KB
// ID made every row of a listing 200 KB wide. Every other column of text
// from a message is cut too (oneLine). A UUID (36) fits whole.
const idWidth = 40

// idCell is an ID for a table column: oneLine at idWidth, with *cut set
// when that shortened it (the table then says where to read it whole).
func idCell(id string, cut *bool) string {
	s := oneLine(id, idWidth)
	if s != esc(id) {
		*cut = true
	}
	return s
}

// cutIDsNote is printed under a table when idCell cut an ID.
const cutIDsNote = "an ID ending in \"…\" is cut: -json prints every ID whole"

// writeJSON prints v as one line of JSON, with the characters that would
// act on a terminal or reorder the text written as \u escapes (see
// dlq.EscapeJSON): encoding/json escapes only the C0 controls.
func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(dlq.EscapeJSON(b), '\n'))
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

type jsonList struct {
	Queue            string        `json:"queue"`
	TotalDeadLetters *int64        `json:"total_dead_letters"`   // null when the broker cannot count them
	Matched          int           `json:"matched"`              // every matching dead letter, not just this page
	Complete         bool          `json:"complete"`             // false: the broker could not be scanned to the end; matched is a lower bound
	Incomplete       string        `json:"incomplete,omitempty"` // why complete is false (absent when it is true)
	Offset           int           `json:"offset"`
	Limit            int           `json:"limit"`
	NextOffset       *int          `json:"next_offset"` // null on the last page
	Messages         []dlq.Message `json:"messages"`
}

type jsonFailure struct {
	ID       string `json:"id"`
	IDBase64 string `json:"id_base64,omitempty"` // only when ID is not UTF-8, as in dlq.Message
	Error    string `json:"error"`
}

type jsonChange struct {
	Action      string        `json:"action"` // "redrive" or "purge"
	Queue       string        `json:"queue"`
	DryRun      bool          `json:"dry_run"`
	Matched     int           `json:"matched"`
	Done        int           `json:"done"`
	Missed      int           `json:"missed"`
	Complete    bool          `json:"complete"`
	Incomplete  string        `json:"incomplete,omitempty"` // why the scan stopped before the end of the dead-letter queue: more may match (exit 4, -dry-run too)
	Interrupted bool          `json:"interrupted"`
	Error       string        `json:"error,omitempty"` // the error that stopped it part-way (exit 4 when some were done)
	Failed      []jsonFailure `json:"failed"`
	Messages    []dlq.Message `json:"messages,omitempty"` // -dry-run: the first of them
}

func failures(fs []dlq.Failure) []jsonFailure {
	out := make([]jsonFailure, 0, len(fs))
	for _, f := range fs {
		j := jsonFailure{ID: f.ID, Error: f.Err.Error()}
		if !utf8.ValidString(f.ID) {
			j.IDBase64 = base64.StdEncoding.EncodeToString([]byte(f.ID))
		}
		out = append(out, j)
	}
	return out
}
