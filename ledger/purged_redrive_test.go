package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// TestRedriveWholeQueueSkipsPurged: a job whose dead letter was purged
// through Ledger.DeadLetters is gone, not redriven: a later redrive of the
// whole queue must not mark it redriven (a state that says it is back on
// its queue and will start again, which it never will). Before, the
// whole-queue redrive marked every job of the queue dead in the ledger,
// the purged one included, and it stayed "redriven" for good.
func TestRedriveWholeQueueSkipsPurged(t *testing.T) {
	e := memoryEnv(t)
	ctx := testCtx(t, 60*time.Second)
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return sdk.Permanent(errors.New("no")) })
	dl := e.deadLetters()

	purged := &sdk.Message{Type: "bad"}
	if err := e.publisher().Publish(ctx, e.queue, purged); err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, e, h, sdk.WorkerOptions{})
	waitJob(t, ctx, e.reader, purged.ID, "dead", func(j *ledger.Job) bool { return j.Status == ledger.StatusDead })
	w.stop(t)
	if n, err := dl.PurgeDeadLetters(ctx, e.queue); err != nil || n != 1 {
		t.Fatalf("PurgeDeadLetters = %d, %v; want 1", n, err)
	}

	again := &sdk.Message{Type: "bad"}
	if err := e.publisher().Publish(ctx, e.queue, again); err != nil {
		t.Fatal(err)
	}
	w = startWorker(t, e, h, sdk.WorkerOptions{})
	waitJob(t, ctx, e.reader, again.ID, "dead", func(j *ledger.Job) bool { return j.Status == ledger.StatusDead })
	w.stop(t)
	time.Sleep(10 * time.Millisecond) // the redrive begins strictly after both deaths and the purge
	if n, err := dl.RedriveDeadLetters(ctx, e.queue); err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters(all) = %d, %v; want 1 (the purged letter is gone)", n, err)
	}
	// The redriven job runs again; the purged one must still be dead.
	w = startWorker(t, e, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{})
	waitJob(t, ctx, e.reader, again.ID, "succeeded in generation 1", func(j *ledger.Job) bool {
		return j.Status == ledger.StatusSucceeded && j.Generation == 1
	})
	w.stop(t)
	if j, err := e.reader.Job(ctx, purged.ID); err != nil || j.Status != ledger.StatusDead || j.Generation != 0 {
		t.Errorf("purged job after a whole-queue redrive that moved only the other: %+v, %v; want it still dead, generation 0", j, err)
	}
}
