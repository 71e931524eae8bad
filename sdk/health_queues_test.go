package sdk_test

import (
	"context"
	"errors"
	"strings"
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
	w, err := sdk.NewWorker(badQueueSub{newFakeSub()}, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queues: []sdk.WorkerQueue{{Name: "good"}, {Name: "bad"}}, QueueIdleWait: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

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
