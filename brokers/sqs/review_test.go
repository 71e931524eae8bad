package sqs_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// TestRedriveKeepsUnsendableDeadLetter: a dead letter that cannot be sent
// back (here: larger than the redriving broker's MaxWireSize) stays in the
// dead-letter queue and is not counted as redriven; the others go back.
func TestRedriveKeepsUnsendableDeadLetter(t *testing.T) {
	big := newBroker(t, fastOptions())
	q := declare(t, big, "redrivekeep", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	large := &sdk.Message{Type: "large", Body: []byte(strings.Repeat("x", 4000))}
	small := &sdk.Message{Type: "small", Body: []byte("ok")}
	if err := big.Publish(ctx, q, large, small); err != nil {
		t.Fatal(err)
	}
	for _, d := range receiveN(t, big, q, 2) {
		if err := d.DeadLetter(ctx, errors.New("boom")); err != nil {
			t.Fatal(err)
		}
	}

	opts := fastOptions()
	opts.MaxWireSize, opts.MaxMessageSize = 2048, 2048
	tiny := newBroker(t, opts)
	n, err := tiny.RedriveDeadLetters(ctx, q)
	var tooLarge *sdk.MessageTooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.ID != large.ID {
		t.Fatalf("RedriveDeadLetters error = %v, want a *sdk.MessageTooLargeError for %s", err, large.ID)
	}
	if n != 1 {
		t.Errorf("RedriveDeadLetters = %d, want 1 (the small message only)", n)
	}
	left, err := big.ListDeadLetters(ctx, q, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].ID != large.ID {
		ids := make([]string, len(left))
		for i, m := range left {
			ids[i] = m.ID
		}
		t.Fatalf("dead letters left = %v, want only the unsendable %s", ids, large.ID)
	}
	got := receiveN(t, big, q, 1)
	if got[0].Message().ID != small.ID {
		t.Fatalf("redriven %s, want %s", got[0].Message().ID, small.ID)
	}
}
