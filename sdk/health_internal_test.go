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
