package sqs

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestCopyReserveWorstCase: a message Publish accepts at exactly
// MaxWireSize less copyReserve, with or without headers of its own, redriven
// up to a 20-character berth-redrive-count, still fits MaxWireSize as its
// redrive, as its shortest dead letter (every annotation left out) and as
// the redrive of that dead letter.
func TestCopyReserveWorstCase(t *testing.T) {
	const limit = 4096
	for _, own := range []map[string]string{nil, {"a": "b"}} {
		for _, count := range []string{"", "1", "9223372036854775807", "-9223372036854775808"} {
			m := &sdk.Message{ID: sdk.NewID(), Type: "t", Body: []byte("x")}
			for k, v := range own {
				m.SetHeader(k, v)
			}
			e, err := encode(m)
			if err != nil {
				t.Fatal(err)
			}
			m.Body = bytes.Repeat([]byte("x"), 1+limit-copyReserve-e.size)
			if e, _ := encode(m); e.size != limit-copyReserve {
				t.Fatalf("test message of %d bytes, want %d", e.size, limit-copyReserve)
			}
			redriven := m.Clone()
			if count != "" {
				redriven.SetHeader(sdk.HeaderRedriveCount, count)
			}
			if e, _ := encode(redriven); e.size > limit {
				t.Fatalf("headers %v, redrive count %q: redriven copy of %d bytes, over %d", own, count, e.size, limit)
			}
			dl := redriven.Clone()
			sdk.AnnotateDeadLetter(dl, strings.Repeat("q", 80), 1000000,
				errors.New(strings.Repeat("\u2028<🚀", 300)), time.Time{}, time.Now())
			if err := fitDeadLetter(dl, limit); err != nil {
				t.Fatalf("headers %v, redrive count %q: %v", own, count, err)
			}
			if e, _ := encode(dl); e.size > limit || dl.Header(HeaderDeadLetterTruncated) != "all" {
				t.Fatalf("headers %v, redrive count %q: dead letter of %d bytes, marked %q", own, count, e.size,
					dl.Header(HeaderDeadLetterTruncated))
			}
			again := dl.Clone()
			delete(again.Headers, HeaderDeadLetterTruncated)
			sdk.PrepareRedrive(again, "q")
			if e, _ := encode(again); e.size > limit {
				t.Fatalf("headers %v, redrive count %q: redrive of the dead letter, %d bytes", own, count, e.size)
			}
		}
	}
}
