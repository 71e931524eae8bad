package sdk

import (
	"errors"
	"testing"
	"time"
)

// TestHealthyWaitMakesALongReceiveCount: after a failed Receive, a Worker
// is ready again once the Receive under way has waited HealthyWait without
// failing (a long poll on an idle queue never returns to prove it), and not
// before. The clock is set directly: waiting HealthyWait for real would
// slow the suite.
func TestHealthyWaitMakesALongReceiveCount(t *testing.T) {
	w := &Worker{opts: WorkerOptions{Queue: "q", Concurrency: 2, Prefetch: 1}}
	w.queues = newQueueStates(w.opts)
	h, q := &w.health, &w.queues[0].health
	h.start(w.queues)
	now := time.Now()
	h.received(q, now.Add(-time.Minute).UnixNano(), now.Add(-time.Minute).UnixNano(), 0, errors.New("connection refused"), false)

	h.receiving(q, now.UnixNano()) // the retry has just started
	if got := w.Health(); got.Ready || got.ReceiveFailures != 1 {
		t.Fatalf("just after a failure: %+v, want not ready", got)
	}
	long := now.Add(-HealthyWait - time.Second).UnixNano()
	h.receiving(q, long) // the retry has waited long enough
	if got := w.Health(); !got.Ready || got.Reason != "" {
		t.Fatalf("after HealthyWait without failing: %+v, want ready", got)
	}
	h.received(q, long, now.UnixNano(), 0, errors.New("connection refused"), false) // and then failed after all
	if got := w.Health(); got.Ready || got.ReceiveFailures != 2 {
		t.Fatalf("after the long Receive failed: %+v, want not ready, 2 failures", got)
	}
	h.received(q, now.UnixNano(), now.UnixNano(), 0, errors.New("context canceled"), true) // cut short by shutdown: no verdict
	if got := w.Health(); got.ReceiveFailures != 2 || got.LastReceiveError != "connection refused" {
		t.Fatalf("a Receive cut short by shutdown changed the verdict: %+v", got)
	}
	if got := w.Health(); got.Capacity != 3 {
		t.Errorf("Capacity %d, want Concurrency + Prefetch = 3", got.Capacity)
	}
}

// TestHealthQueueStarvedOfSlots: on a Worker of several queues, a queue
// with a failure on record whose loop has waited HealthyWait for a slot
// (the allocator gives them all to a higher-priority queue with work)
// does not keep the Worker unready: it is not receiving by the allocator's
// choice. Before it has waited that long, it still counts as failing.
func TestHealthQueueStarvedOfSlots(t *testing.T) {
	w := &Worker{opts: WorkerOptions{Queues: []WorkerQueue{{Name: "high"}, {Name: "low"}}, Concurrency: 2, Prefetch: 2}}
	w.queues = newQueueStates(w.opts)
	h, low := &w.health, &w.queues[1].health
	h.start(w.queues)
	h.state.Store(hRunning)
	now := time.Now()
	h.received(low, now.UnixNano(), now.UnixNano(), 0, errors.New("blip"), false)
	// A later failure of high, healed at once: the reason is still low's.
	high := &w.queues[0].health
	h.received(high, now.UnixNano(), now.UnixNano(), 0, errors.New("high's hiccup"), false)
	h.received(high, now.UnixNano(), now.UnixNano(), 0, nil, false)
	low.waitingForSlot(true)
	if got := w.Health(); got.Ready || got.Reason != "receive failing on low: blip" {
		t.Fatalf("just after low's failure, waiting for a slot: %+v, want not ready, with low's error as the reason", got)
	}
	low.slotWait.Store(now.Add(-HealthyWait - time.Second).UnixNano()) // starved that long
	if got := w.Health(); !got.Ready {
		t.Fatalf("low starved of slots for over HealthyWait: %+v, want ready", got)
	}
	low.waitingForSlot(false) // it got a slot: its next Receive decides
	if got := w.Health(); got.Ready {
		t.Fatalf("low holds a slot again, failure on record: %+v, want not ready", got)
	}
	h.received(low, now.UnixNano(), now.UnixNano(), 1, nil, false)
	if got := w.Health(); !got.Ready {
		t.Fatalf("low received: %+v, want ready", got)
	}
}
