package sdk_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berthq/berth/sdk"
)

// headerBytes is a size function for FitDeadLetter: the bytes of m's body
// and headers, keys and values.
func headerBytes(m *sdk.Message) (int, error) {
	n := len(m.Body)
	for k, v := range m.Headers {
		n += len(k) + len(v)
	}
	return n, nil
}

// annotated returns a dead-letter copy of a message with body size bytes,
// a long multi-byte reason, and its size.
func annotated(t *testing.T, body int) (*sdk.Message, int) {
	t.Helper()
	m := &sdk.Message{ID: "m1", Body: make([]byte, body), Headers: map[string]string{"app": "x"}}
	sdk.AnnotateDeadLetter(m, "q", 3, errors.New(strings.Repeat("é", 400)), time.Time{}, time.Now())
	n, _ := headerBytes(m)
	return m, n
}

// TestFitDeadLetter: a copy that fits is left alone; one a little over the
// limit has its reason cut on a rune boundary to the longest prefix that
// fits, marked "reason"; one whose annotations cannot fit loses them all,
// marked "all"; one too large even then is a MessageTooLargeError. The
// message's own headers and body are never touched, and the last size call
// is on the copy as returned.
func TestFitDeadLetter(t *testing.T) {
	t.Run("fits", func(t *testing.T) {
		m, n := annotated(t, 100)
		before := m.Clone()
		if err := sdk.FitDeadLetter(m, n, headerBytes); err != nil {
			t.Fatal(err)
		}
		if m.Header(sdk.HeaderDeadLetterReason) != before.Header(sdk.HeaderDeadLetterReason) || m.Header(sdk.HeaderDeadLetterTruncated) != "" {
			t.Fatalf("a copy that fits was changed: %v", m.Headers)
		}
	})
	t.Run("reason cut", func(t *testing.T) {
		m, n := annotated(t, 100)
		limit := n - 101
		var last *sdk.Message
		size := func(m *sdk.Message) (int, error) { last = m.Clone(); return headerBytes(m) }
		if err := sdk.FitDeadLetter(m, limit, size); err != nil {
			t.Fatal(err)
		}
		got, _ := headerBytes(m)
		r := m.Header(sdk.HeaderDeadLetterReason)
		switch {
		case got > limit:
			t.Fatalf("size %d over limit %d", got, limit)
		case m.Header(sdk.HeaderDeadLetterTruncated) != "reason":
			t.Fatalf("truncated header %q, want reason", m.Header(sdk.HeaderDeadLetterTruncated))
		case !strings.HasSuffix(r, "…") || !utf8.ValidString(r):
			t.Fatalf("reason %q not cut on a rune boundary with a marker", r)
		case limit-got >= len("é"): // one more rune would have fitted
			t.Fatalf("reason cut too short: size %d, limit %d", got, limit)
		case m.Header("app") != "x" || len(m.Body) != 100 || m.Header(sdk.HeaderDeadLetterClass) == "":
			t.Fatalf("the message or other annotations changed: %v", m.Headers)
		case last.Header(sdk.HeaderDeadLetterReason) != r:
			t.Fatalf("last size call on reason %q, the copy has %q", last.Header(sdk.HeaderDeadLetterReason), r)
		}
	})
	t.Run("all left out", func(t *testing.T) {
		m, _ := annotated(t, 1000)
		if err := sdk.FitDeadLetter(m, 1000+len("app")+len("x")+len(sdk.HeaderDeadLetterTruncated)+len("all"), headerBytes); err != nil {
			t.Fatal(err)
		}
		if m.Header(sdk.HeaderDeadLetterTruncated) != "all" || m.Header(sdk.HeaderDeadLetterReason) != "" ||
			m.Header(sdk.HeaderDeadLetterQueue) != "" || m.Header("app") != "x" {
			t.Fatalf("headers %v; want every annotation left out, marked all", m.Headers)
		}
	})
	t.Run("too large", func(t *testing.T) {
		m, _ := annotated(t, 1000)
		var tl *sdk.MessageTooLargeError
		if err := sdk.FitDeadLetter(m, 999, headerBytes); !errors.As(err, &tl) || tl.ID != "m1" || tl.Limit != 999 {
			t.Fatalf("err %v; want a MessageTooLargeError of m1 at 999", err)
		}
	})
	t.Run("size error", func(t *testing.T) {
		m, _ := annotated(t, 10)
		boom := errors.New("boom")
		if err := sdk.FitDeadLetter(m, 1, func(*sdk.Message) (int, error) { return 0, boom }); !errors.Is(err, boom) {
			t.Fatalf("err %v; want size's error", err)
		}
	})
}

// TestTruncatedMarkerIsBerths: a berth-dlq-truncated header a producer
// set (or a previous dead-lettering left) does not survive a new
// annotation or a redrive: only FitDeadLetter writes it.
func TestTruncatedMarkerIsBerths(t *testing.T) {
	m := &sdk.Message{ID: "m1", Headers: map[string]string{sdk.HeaderDeadLetterTruncated: "all"}}
	sdk.AnnotateDeadLetter(m, "q", 1, errors.New("x"), time.Time{}, time.Now())
	if v := m.Header(sdk.HeaderDeadLetterTruncated); v != "" {
		t.Fatalf("forged marker %q kept by AnnotateDeadLetter", v)
	}
	m.SetHeader(sdk.HeaderDeadLetterTruncated, "reason")
	sdk.PrepareRedrive(m, "q")
	if v := m.Header(sdk.HeaderDeadLetterTruncated); v != "" {
		t.Fatalf("marker %q kept by PrepareRedrive", v)
	}
}
