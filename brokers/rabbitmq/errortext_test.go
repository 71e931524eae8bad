package rabbitmq

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestErrorsEscapeMessageID: the broker's errors wrote message IDs raw
// (%s), so the CLI, which escapes only what is still raw in an error's text
// (not backslashes), showed an ID holding the characters \x1b and one
// holding an ESC byte alike. Each ID is written as sdk.ErrorText does:
// quoted with Go escapes exactly once.
func TestErrorsEscapeMessageID(t *testing.T) {
	const forged = `id\x1b` + "\x1b[31m"
	const want = `"id\\x1b\x1b[31m"`
	_, queue, b := brokerOnQueue(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	deadLetterN(t, ctx, b, queue, 1) // the dead-letter queue holds another letter
	_, getErr := b.GetDeadLetter(ctx, queue, forged)
	_, redriveErr := b.RedriveDeadLetters(ctx, queue, forged)
	_, deleteErr := b.DeleteDeadLetters(ctx, queue, forged)
	for _, c := range []struct {
		name   string
		err    error
		target error
	}{
		{"GetDeadLetter", getErr, sdk.ErrNotFound},
		{"RedriveDeadLetters", redriveErr, sdk.ErrNotFound},
		{"DeleteDeadLetters", deleteErr, sdk.ErrNotFound},
		{"DelayError", &DelayError{ID: forged, Delay: time.Hour, Max: time.Minute}, sdk.ErrInvalidMessage},
		{"lost", (&delivery{msg: &sdk.Message{ID: forged}}).lost(), sdk.ErrLeaseLost},
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
