package jetstream_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// TestErrorsEscapeMessageID: LeaseLostError wrote the message ID raw (%s),
// so the CLI, which escapes only what is still raw in an error's text (not
// backslashes), showed an ID holding the characters \x1b and one holding an
// ESC byte alike. Each ID in the broker's errors is quoted with Go escapes
// exactly once.
func TestErrorsEscapeMessageID(t *testing.T) {
	const forged = `id\x1b` + "\x1b[31m"
	const want = `"id\\x1b\x1b[31m"`
	for _, c := range []struct {
		name   string
		err    error
		target error
	}{
		{"LeaseLostError", &jetstream.LeaseLostError{Queue: "q", ID: forged, Ended: time.Now()}, sdk.ErrLeaseLost},
		{"NotFoundError", &jetstream.NotFoundError{Queue: "q", ID: forged}, sdk.ErrNotFound},
	} {
		if !errors.Is(c.err, c.target) {
			t.Errorf("%s: %v, want an error wrapping %v", c.name, c.err, c.target)
			continue
		}
		if text := c.err.Error(); strings.Contains(text, "\x1b") || !strings.Contains(text, want) {
			t.Errorf("%s: %q, want the ID escaped once as %s and no raw ESC", c.name, text, want)
		}
	}
}
