package sdk_test

import (
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// AnnotateDeadLetter does not trust a berth-first-failure header it finds
// on the message (a producer outside berth may have set it): a value that
// is no RFC 3339 time, or a time after the dead-lettering, is replaced with
// now; a valid earlier time (a broker's own, e.g. RabbitMQ's retry copies)
// is kept, in UTC.
func TestAnnotateDeadLetterValidatesForeignFirstFailure(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	nowText := now.Format(time.RFC3339Nano)
	for _, c := range []struct{ name, header, want string }{
		{"none", "", nowText},
		{"garbage", "yesterday", nowText},
		{"injection", "<script>alert(1)</script>", nowText},
		{"in the future", "2030-01-01T00:00:00Z", nowText},
		{"earlier", "2026-12-04T11:00:00Z", "2026-12-04T11:00:00Z"},
		{"earlier, other zone", "2026-12-04T12:30:00+01:00", "2026-12-04T11:30:00Z"},
	} {
		m := &sdk.Message{Type: "t"}
		if c.header != "" {
			m.SetHeader(sdk.HeaderFirstFailure, c.header)
		}
		sdk.AnnotateDeadLetter(m, "q", 3, errors.New("boom"), time.Time{}, now)
		if got := m.Header(sdk.HeaderFirstFailure); got != c.want {
			t.Errorf("%s: berth-first-failure %q, want %q", c.name, got, c.want)
		}
		if got := m.Header(sdk.HeaderLastFailure); got != nowText {
			t.Errorf("%s: berth-last-failure %q, want %q", c.name, got, nowText)
		}
	}
	// A first failure the broker knows is used, whatever the header says.
	m := &sdk.Message{Type: "t"}
	m.SetHeader(sdk.HeaderFirstFailure, "2026-12-04T11:00:00Z")
	known := now.Add(-time.Minute)
	sdk.AnnotateDeadLetter(m, "q", 3, errors.New("boom"), known, now)
	if got := m.Header(sdk.HeaderFirstFailure); got != known.Format(time.RFC3339Nano) {
		t.Errorf("known first failure: header %q, want %q", got, known.Format(time.RFC3339Nano))
	}
}

// SetFirstFailure applies AnnotateDeadLetter's rule alone (RabbitMQ's
// Retry uses it for the first failure its copy carries): a header that is
// no RFC 3339 time, or one after now, becomes now; a valid earlier time is
// kept, in UTC; a known first failure wins.
func TestSetFirstFailure(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		header string
		known  time.Time
		want   string
	}{
		{"", time.Time{}, "2026-12-04T12:00:00Z"},
		{"garbage", time.Time{}, "2026-12-04T12:00:00Z"},
		{"2026-12-04T12:00:01Z", time.Time{}, "2026-12-04T12:00:00Z"},
		{"2026-12-04T12:30:00.5+01:00", time.Time{}, "2026-12-04T11:30:00.5Z"},
		{"garbage", now.Add(-time.Hour), "2026-12-04T11:00:00Z"},
	} {
		m := &sdk.Message{}
		if c.header != "" {
			m.SetHeader(sdk.HeaderFirstFailure, c.header)
		}
		sdk.SetFirstFailure(m, c.known, now)
		if got := m.Header(sdk.HeaderFirstFailure); got != c.want {
			t.Errorf("header %q, known %s: %q; want %q", c.header, c.known, got, c.want)
		}
	}
}
