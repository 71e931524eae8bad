package sqs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/sqs"
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
	b := newBroker(t, sqs.Options{})
	q := declare(t, b, "errtext", false, sqs.QueueConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, getErr := b.GetDeadLetter(ctx, q, forged)
	_, redriveErr := b.RedriveDeadLetters(ctx, q, forged, "plain")
	_, deleteErr := b.DeleteDeadLetters(ctx, q, forged, "plain")
	for _, c := range []struct {
		name   string
		err    error
		target error
	}{
		{"GetDeadLetter", getErr, sdk.ErrNotFound},
		{"RedriveDeadLetters", redriveErr, sdk.ErrNotFound},
		{"DeleteDeadLetters", deleteErr, sdk.ErrNotFound},
		{"DelayError", &sqs.DelayError{ID: forged, Delay: time.Hour, Max: 15 * time.Minute}, sdk.ErrInvalidMessage},
		{"DelayError FIFO", &sqs.DelayError{ID: forged, Delay: time.Second}, sdk.ErrInvalidMessage},
		{"LeaseCeilingError", &sqs.LeaseCeilingError{ID: forged, Requested: 13 * time.Hour, Received: time.Now()}, sqs.ErrLeaseCeiling},
		{"AckError", &sqs.AckError{Queue: q, ID: forged, Err: sdk.ErrUnavailable}, sdk.ErrUnavailable},
	} {
		if !errors.Is(c.err, c.target) {
			t.Errorf("%s: %v, want an error wrapping %v", c.name, c.err, c.target)
			continue
		}
		if text := c.err.Error(); strings.Contains(text, "\x1b") || !strings.Contains(text, want) {
			t.Errorf("%s: %q, want the ID escaped once as %s and no raw ESC", c.name, text, want)
		}
	}
	if !strings.Contains(redriveErr.Error(), want+", plain of ") {
		t.Errorf("RedriveDeadLetters: %q, want each missing ID escaped alone", redriveErr)
	}
}
