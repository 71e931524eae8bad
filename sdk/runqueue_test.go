package sdk_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// TestBatchReachesEveryHandlerGoroutine checks that one received batch of
// blocking jobs runs on all Concurrency handler goroutines at once. Idle
// handler goroutines are woken one at a time (each woken one wakes the next
// when work is left), so a wake-up chain that stopped early would leave
// jobs waiting behind the blocked ones and this test would time out.
func TestBatchReachesEveryHandlerGoroutine(t *testing.T) {
	const conc = 8
	for round := range 20 {
		sub := newFakeSub()
		var started atomic.Int32
		all := make(chan struct{})
		h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
			if started.Add(1) == conc {
				close(all)
			}
			select {
			case <-all:
				return nil
			case <-time.After(10 * time.Second):
				return sdk.Permanent(context.DeadlineExceeded)
			}
		})
		// Queued before Run: the first Receive returns all of them in one batch.
		fs := make([]*berthtest.Delivery, conc)
		for i := range fs {
			fs[i] = newFake(1, "job")
			sub.ch <- fs[i].WithoutRelease()
		}
		stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: conc, Prefetch: conc, HeartbeatInterval: -1})
		for _, f := range fs {
			waitSettled(t, f)
		}
		for i, f := range fs {
			if a := actions(f); len(a) != 1 || a[0] != "ack" {
				t.Fatalf("round %d: job %d settled %v, want [ack]: not every handler goroutine was woken", round, i, a)
			}
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
}
