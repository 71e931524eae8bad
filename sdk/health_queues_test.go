package sdk_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// badQueueSub fails every Receive on queue "bad" (a transient error, so the
// Worker keeps retrying it) and long-polls the others.
type badQueueSub struct{ *fakeSub }

func (s badQueueSub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	if queue == "bad" {
		return nil, errors.New("receive bad: access refused")
	}
	return s.fakeSub.Receive(ctx, queue, max)
}

// TestHealthOneFailingQueueOfSeveral: a Worker on several queues whose
// Receives keep failing on one of them is not ready, although its other
// queue's Receives succeed: the queues' verdicts are their own, and a
// success on one must not hide the failures of another (before, they shared
// one failure counter, which every idle poll of the healthy queue reset, so
// the Worker reported ready while one of its queues was not received at
// all). Pausing the failing queue makes the Worker ready (a paused queue
// does not make it unready); resuming it makes it unready again.
func TestHealthOneFailingQueueOfSeveral(t *testing.T) {
	w := runTwoQueues(t, badQueueSub{newFakeSub()}, "good", "bad", 10*time.Millisecond)

	waitHealth(t, w, "failing on bad", func(h sdk.Health) bool { return h.LastReceiveError != "" })
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if h := w.Health(); h.Ready || !strings.Contains(h.Reason, "access refused") {
			t.Fatalf("queue bad fails every Receive, yet: %+v; want not ready, with its error as the reason", h)
		}
	}
	if err := w.Pause("bad"); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, w, "ready with bad paused", func(h sdk.Health) bool { return h.Ready })
	if err := w.Resume("bad"); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, w, "not ready with bad resumed", func(h sdk.Health) bool { return !h.Ready && h.ReceiveFailures > 0 })
}

// stallingSub is a broker whose queue "flaky" fails its first Receive at
// once (a refused connection) and then answers no more: each later Receive
// waits for its context (a blackholed host). Other queues are idle.
type stallingSub struct {
	*fakeSub
	calls atomic.Int32
}

func (s *stallingSub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	if queue == "flaky" && s.calls.Add(1) == 1 {
		return nil, errors.New("dial tcp: connection refused")
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestHealthCutOffReceiveIsNoSuccess: on a Worker of several queues, a
// Receive cut off at QueueIdleWait proved nothing about the broker. After a
// failure, cut-offs do not make the Worker ready before they have spanned
// HealthyWait (as a single queue's Receive must wait that long), nor clear
// the failure count, nor move LastReceive (no Receive returned). Before,
// each cut-off counted as a Receive returned without error: ready again
// QueueIdleWait after the failure, with no failure on record.
func TestHealthCutOffReceiveIsNoSuccess(t *testing.T) {
	sub := &stallingSub{fakeSub: newFakeSub()}
	w := runTwoQueues(t, sub, "idle", "flaky", 5*time.Millisecond)

	waitHealth(t, w, "failing on flaky", func(h sdk.Health) bool { return h.LastReceiveError != "" })
	// Well past the backoff (50-75 ms) and many cut-offs of both queues,
	// well before HealthyWait.
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if h := w.Health(); h.Ready || h.ReceiveFailures != 1 || !strings.Contains(h.Reason, "connection refused") {
			t.Fatalf("flaky failed, then its Receives were only cut off: %+v; want not ready, 1 failure", h)
		}
	}
	if h := w.Health(); !h.LastReceive.IsZero() {
		t.Errorf("LastReceive %v: no Receive returned, all were cut off", h.LastReceive)
	}
	if n := sub.calls.Load(); n < 3 {
		t.Fatalf("flaky received %d times: the cut-offs this test is about did not happen", n)
	}
}

// slowFailSub fails every Receive on queue "slow" with its own error once
// the call's context has ended, as a call that runs into its own network
// timeout just then, or past a deadline it did not watch, does.
type slowFailSub struct{ *fakeSub }

func (s slowFailSub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	if queue == "slow" {
		<-ctx.Done()
		time.Sleep(time.Millisecond)
		return nil, errors.New("read tcp: i/o timeout")
	}
	return s.fakeSub.Receive(ctx, queue, max)
}

// TestHealthFailureAfterQueueIdleWaitCounts: on a Worker of several queues,
// a Receive that fails with its own error after QueueIdleWait has passed
// failed: only the wait's own error (context.DeadlineExceeded) or none
// makes it a cut-off. Before, any error returned once the wait had run out
// was dropped: the queue looked healthy, with no error on record, while
// every Receive on it failed.
func TestHealthFailureAfterQueueIdleWaitCounts(t *testing.T) {
	w := runTwoQueues(t, slowFailSub{newFakeSub()}, "good", "slow", 5*time.Millisecond)

	h := waitHealth(t, w, "failing on slow", func(h sdk.Health) bool { return !h.Ready && h.ReceiveFailures > 0 })
	if !strings.Contains(h.LastReceiveError, "i/o timeout") || !strings.Contains(h.Reason, "receive failing on slow") {
		t.Fatalf("health %+v: want slow's i/o timeout on record as the reason", h)
	}
}

// runTwoQueues runs, until the test ends, a Worker with a no-op handler on
// queues a and b of sub, cutting idle Receives off at idleWait.
func runTwoQueues(t *testing.T, sub sdk.Subscriber, a, b string, idleWait time.Duration) *sdk.Worker {
	t.Helper()
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queues: []sdk.WorkerQueue{{Name: a}, {Name: b}}, QueueIdleWait: idleWait, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}
