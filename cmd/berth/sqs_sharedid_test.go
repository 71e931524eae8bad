package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestOnSQSFilterLeavesSharedID: on SQS, whose redrive and delete by ID
// move every dead letter holding the ID, "berth dlq redrive -type X" moved
// a letter of another type that shared a chosen letter's ID (the memory,
// PostgreSQL and JetStream brokers hold such an ID back, dlq.ErrSharedID):
// a letter the operator did not choose, beyond the count confirmed. The
// change's scan reads every letter before it moves any, so it counts each
// ID's letters there and holds the ID back too, as the dry run counts it.
func TestOnSQSFilterLeavesSharedID(t *testing.T) {
	u, queue, b, _ := sqsDeadLettered(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, m := range []*sdk.Message{{ID: "dup", Type: "billing.charge"}, {ID: "dup", Type: "billing.refund"}, {ID: "own", Type: "billing.charge"}} {
		if err := b.Publish(ctx, queue, m); err != nil {
			t.Fatal(err)
		}
		var ds []sdk.Delivery
		for len(ds) == 0 {
			var err error
			if ds, err = b.Receive(ctx, queue, 1); err != nil {
				t.Fatal(err)
			}
		}
		if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
			t.Fatal(err)
		}
	}
	r := cliOn(t, u, "dlq", "redrive", queue, "-type", "billing.charge", "-dry-run")
	if r.code != exitPartial || !strings.Contains(r.out, "would redrive 1 dead letter(s) of "+queue) || !strings.Contains(r.out, "1 more match, but would be left") ||
		!strings.Contains(r.out, "would not redrive: dup: dead letters the change did not choose hold this ID too") {
		t.Errorf("dry run (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	r = cliOn(t, u, "dlq", "redrive", queue, "-type", "billing.charge", "-yes")
	if r.code != exitPartial || !strings.Contains(r.out, "redriven 1 dead letter(s)") ||
		!strings.Contains(r.out, "not redriven: dup: dead letters the change did not choose hold this ID too") {
		t.Errorf("redrive (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	statsAre(t, u, queue, 1, 2) // own redriven; both letters holding dup left
}
