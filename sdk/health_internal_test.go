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

// TestHealthReceiveStartedBeforeFailureDoesNotCount: with several receive
// loops on one queue, a Receive that was already under way when another
// loop's Receive failed proves nothing about the broker since the failure.
// Loop B starts, loop A starts later (the latest start on record), and B
// fails: A's long wait, mostly before the failure, must not make the Worker
// ready at once; only a Receive started since the failure that waits
// HealthyWait (or a Receive that returns without error) does.
func TestHealthReceiveStartedBeforeFailureDoesNotCount(t *testing.T) {
	w := &Worker{opts: WorkerOptions{Queue: "q", Concurrency: 4, ReceiveLoops: 2}}
	w.queues = newQueueStates(w.opts)
	h, q := &w.health, &w.queues[0].health
	h.start(w.queues)
	now := time.Now()
	startB := now.Add(-time.Minute).UnixNano()
	startA := now.Add(-HealthyWait - time.Second).UnixNano()
	h.receiving(q, startB)
	h.receiving(q, startA)
	h.received(q, startB, now.UnixNano(), 0, errors.New("connection refused"), false) // B fails now
	if got := w.Health(); got.Ready {
		t.Fatalf("just after B's Receive failed, A's Receive started before the failure: %+v, want not ready", got)
	}
	later := now.Add(time.Millisecond).UnixNano()
	h.receiving(q, later) // B's retry: not yet waited HealthyWait
	if got := w.Health(); got.Ready {
		t.Fatalf("B's retry has just started: %+v, want not ready", got)
	}
	h.received(q, startA, now.UnixNano(), 0, nil, false) // A returns without error: proof
	if got := w.Health(); !got.Ready {
		t.Fatalf("A's Receive returned without error: %+v, want ready", got)
	}
}

// TestHealthCutOffsSpanningHealthyWait: on a Worker of several queues,
// Receives cut off at QueueIdleWait since a failure make the queue ready
// again once they span HealthyWait (one long wait without failing, cut in
// pieces), not before; a new failure starts the span again, and a Receive
// that returns ends it.
func TestHealthCutOffsSpanningHealthyWait(t *testing.T) {
	w := &Worker{opts: WorkerOptions{Queues: []WorkerQueue{{Name: "a"}, {Name: "b"}}, Concurrency: 2}}
	w.queues = newQueueStates(w.opts)
	h, q := &w.health, &w.queues[1].health
	h.start(w.queues)
	now := time.Now()
	at := func(d time.Duration) int64 { return now.Add(d).UnixNano() }
	h.received(q, at(-time.Hour), at(-time.Hour), 0, errors.New("connection refused"), false)
	h.idle(q, at(-HealthyWait+time.Second)) // the first cut-off since: not long enough yet
	h.idle(q, at(-time.Millisecond))
	if got := w.Health(); got.Ready || got.ReceiveFailures != 1 || !got.LastReceive.IsZero() {
		t.Fatalf("cut-offs spanning less than HealthyWait: %+v, want not ready, 1 failure, no LastReceive", got)
	}
	h.received(q, at(-time.Minute), at(-time.Minute), 0, errors.New("connection refused"), false)
	h.idle(q, at(-HealthyWait-time.Second))
	h.idle(q, at(-time.Millisecond))
	if got := w.Health(); !got.Ready || got.ReceiveFailures != 2 {
		t.Fatalf("cut-offs spanning HealthyWait since the failure: %+v, want ready, failures still on record", got)
	}
	h.received(q, now.UnixNano(), now.UnixNano(), 0, errors.New("connection refused"), false)
	if got := w.Health(); got.Ready {
		t.Fatalf("a failure after the cut-offs: %+v, want not ready", got)
	}
	h.idle(q, now.UnixNano())
	if got := w.Health(); got.Ready {
		t.Fatalf("a cut-off just after a new failure: %+v, want not ready", got)
	}
	h.received(q, now.UnixNano(), now.UnixNano(), 0, nil, false)
	if got := w.Health(); !got.Ready || got.ReceiveFailures != 0 {
		t.Fatalf("a Receive returned without error: %+v, want ready, no failures", got)
	}
	h.received(q, now.UnixNano(), now.UnixNano(), 0, errors.New("connection refused"), false)
	if got := w.Health(); got.Ready {
		t.Fatalf("a failure after a success: %+v, want not ready (no cut-off span left over)", got)
	}
}
