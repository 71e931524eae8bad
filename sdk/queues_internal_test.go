package sdk

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

type countingReceiver struct{ calls atomic.Int32 }

func (s *countingReceiver) Receive(ctx context.Context, _ string, _ int) ([]Delivery, error) {
	s.calls.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestPausedQueueHandsBackALateSlot: a multi-queue receive loop that finds
// its queue paused hands its slots back, but the allocator may still hand it
// one: pick saw the queue running just before Pause, and its send lands once
// the loop has returned its slots (or between the loop taking its slots and
// checking the pause). That late slot must go back to the other queues too.
// The loop used to wait for Resume alone, so the slot stayed in the paused
// queue's channel until Resume or the end of Run: the other queues ran with
// a slot fewer.
func TestPausedQueueHandsBackALateSlot(t *testing.T) {
	sub := &countingReceiver{}
	w, err := NewWorker(sub, HandlerFunc(func(context.Context, Delivery) error { return nil }), WorkerOptions{
		Queues: []WorkerQueue{{Name: "a"}, {Name: "b"}}, Concurrency: 1, Prefetch: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	const capacity = 2
	free := make(chan int, capacity)
	held := make([]atomic.Pointer[task], capacity)
	q := w.queue("a")
	q.slots = make(chan int, capacity)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q.begin(ctx)
	defer q.end()
	if err := w.Pause("a"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.receive(ctx, q, q.slots, free, newRunQueue(capacity), nil, held) }()

	q.slots <- 0 // handed to a before the pause
	select {
	case <-free:
	case <-time.After(5 * time.Second):
		t.Fatal("paused queue kept the slot it held")
	}
	q.slots <- 1 // the allocator's late hand-over
	select {
	case <-free:
	case <-time.After(time.Second):
		t.Errorf("paused queue kept a slot handed to it late: %d slot(s) stranded until Resume", len(q.slots))
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("receive: %v", err)
	}
	if n := sub.calls.Load(); n != 0 {
		t.Errorf("%d Receive calls on a paused queue", n)
	}
}
