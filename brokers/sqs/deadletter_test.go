package sqs

import (
	"bytes"
	"errors"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berthq/berth/sdk"
)

// TestFitDeadLetterShortensOnlyAnnotations: for messages at every size
// Publish accepts, with reasons that JSON escapes (one to six bytes a byte)
// and runes of every width, fitDeadLetter makes the annotated copy fit,
// keeps the message exact, cuts the reason to the longest prefix that fits
// (on a rune boundary), and leaves every annotation out only when an empty
// reason does not fit.
func TestFitDeadLetterShortensOnlyAnnotations(t *testing.T) {
	const limit = 2048
	if copyReserve != 83 {
		t.Errorf("copyReserve = %d; the package doc, Options.MaxWireSize and ARCHITECTURE.md say 83", copyReserve)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	pieces := []string{"a", "<", "&", "\"", "\x01", "é", "✗", "🚀", "\ufffe", " "}
	for range 300 {
		var reason strings.Builder
		for reason.Len() < sdk.MaxReasonLength+64 {
			reason.WriteString(pieces[rng.IntN(len(pieces))])
		}
		m := &sdk.Message{ID: sdk.NewID(), Type: "t", CorrelationID: "c", Headers: map[string]string{"x-user": "ü✓"}}
		if rng.IntN(2) == 0 {
			m.Body = bytes.Repeat([]byte("b"), rng.IntN(limit))
		} else {
			m.Body = bytes.Repeat([]byte{0xff}, rng.IntN(limit*3/4)) // base64
		}
		if e, err := encode(m); err != nil || e.size > limit-copyReserve {
			continue // Publish refuses it
		}
		orig := m.Clone()
		sdk.AnnotateDeadLetter(m, "queue-"+strings.Repeat("q", rng.IntN(70)), 5, errors.New(reason.String()), time.Time{}, time.Now())
		full := m.Clone()
		if err := fitDeadLetter(m, limit); err != nil {
			t.Fatalf("fitDeadLetter of a message Publish accepts: %v", err)
		}
		e, err := encode(m)
		if err != nil {
			t.Fatal(err)
		}
		if e.size > limit {
			t.Fatalf("copy of %d bytes, over %d", e.size, limit)
		}
		if m.ID != orig.ID || m.Type != orig.Type || m.CorrelationID != orig.CorrelationID ||
			!bytes.Equal(m.Body, orig.Body) || m.Header("x-user") != orig.Header("x-user") {
			t.Fatalf("message changed: %+v, want %+v", m, orig)
		}
		got := m.Header(sdk.HeaderDeadLetterReason)
		switch m.Header(HeaderDeadLetterTruncated) {
		case "":
			if !maps.Equal(m.Headers, full.Headers) {
				t.Fatalf("a copy that fits was changed: %q", m.Headers)
			}
		case "reason":
			r := strings.TrimSuffix(full.Header(sdk.HeaderDeadLetterReason), "…")
			cut := strings.TrimSuffix(got, "…")
			if !utf8.ValidString(got) || !strings.HasPrefix(r, cut) || len(cut) == len(r) {
				t.Fatalf("reason %q: want a shorter prefix of %q", got, r)
			}
			if m.Header(sdk.HeaderDeadLetterClass) == "" || m.Header(sdk.HeaderDeadLetterQueue) == "" {
				t.Fatalf("annotations left out with the reason cut: %q", m.Headers)
			}
			// One more rune of the reason does not fit.
			_, n := utf8.DecodeRuneInString(r[len(cut):])
			longer := m.Clone()
			longer.SetHeader(sdk.HeaderDeadLetterReason, r[:len(cut)+n]+"…")
			if e, _ := encode(longer); e.size <= limit {
				t.Fatalf("reason cut to %d bytes, but %d fit", len(cut), len(cut)+n)
			}
		case "all":
			for _, h := range deadLetterNotes {
				if _, ok := m.Headers[h]; ok {
					t.Fatalf("truncated all, %s kept", h)
				}
			}
			empty := full.Clone()
			empty.SetHeader(HeaderDeadLetterTruncated, "reason")
			delete(empty.Headers, sdk.HeaderDeadLetterReason)
			if e, _ := encode(empty); e.size <= limit {
				t.Fatal("every annotation left out, but the copy fit with the reason left out alone")
			}
		default:
			t.Fatalf("%s = %q", HeaderDeadLetterTruncated, m.Header(HeaderDeadLetterTruncated))
		}
	}
	// A message Publish never checked (another producer's) whose shortest
	// copy is too large: typed error.
	m := &sdk.Message{ID: "foreign", Body: bytes.Repeat([]byte("x"), limit)}
	sdk.AnnotateDeadLetter(m, "q", 1, errors.New("boom"), time.Time{}, time.Now())
	var tooLarge *sdk.MessageTooLargeError
	if err := fitDeadLetter(m, limit); !errors.As(err, &tooLarge) || tooLarge.Limit != limit {
		t.Fatalf("fitDeadLetter of a message over the limit: %v, want *sdk.MessageTooLargeError", err)
	}
}
