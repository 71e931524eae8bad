package brokertest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"

	"github.com/berthq/berth/sdk"
)

// testWorkerShutdownKeepsAttempt (issue 11 item 1): a clean shutdown never
// consumes an attempt. N messages are published, a Worker handles a few and
// is stopped, and the broker instance is closed as a process shutting down
// would; every message no handler saw then comes back with Attempt() 1,
// wherever it waited: in the server, prefetched by the broker instance, or
// received by the Worker but not started. With a peer the rest is read on
// the peer after the instance closed; without one (memory) on the same
// instance before closing it.
func testWorkerShutdownKeepsAttempt(t *testing.T, e *env) {
	const n, stopAfter = 40, 3
	ids := e.publishMany(t, n, "brokertest.shutdown")
	ctx, cancel := context.WithCancel(e.ctx(t))
	defer cancel()
	var mu sync.Mutex
	handled := map[string]bool{}
	h := sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if !e.attemptIs(d.Attempt(), 1) {
			t.Errorf("first run of %s: Attempt() = %d, want 1", d.Message().ID, d.Attempt())
		}
		handled[d.Message().ID] = true
		if len(handled) >= stopAfter {
			cancel()
		}
		return nil
	})
	w, err := sdk.NewWorker(e.b, h, sdk.WorkerOptions{
		Queue: e.q, Concurrency: 2, Prefetch: 2, Lease: e.h.Lease,
		DrainTimeout: e.h.Timeout / 2, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	if err := w.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Worker.Run: %v", err)
	}
	mu.Lock()
	seen := len(handled)
	mu.Unlock()
	if seen >= n {
		t.Fatalf("the Worker handled all %d messages before it stopped; nothing left to check", n)
	}
	rest := e.b
	if e.supports(CapPeer) {
		rest = e.h.Peer(t, e.b)
		t.Cleanup(func() { _ = rest.Close() })
		if err := e.b.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	rctx := e.ctx(t)
	got := map[string]bool{}
	e.receiveEachOn(t, rest, e.q, n-seen, func(d sdk.Delivery) { // each acked within its lease
		id := d.Message().ID
		switch {
		case handled[id]:
			t.Errorf("message %s came back after its handler succeeded", id)
		case got[id]:
			t.Errorf("message %s delivered twice", id)
		case !e.attemptIs(d.Attempt(), 1):
			t.Errorf("message %s, never handled, came back with Attempt() = %d, want 1", id, d.Attempt())
		}
		got[id] = true
		settleAck(t, rctx, d)
	})
	for _, id := range ids {
		if !handled[id] && !got[id] {
			t.Errorf("message %s neither handled nor back", id)
		}
	}
}
