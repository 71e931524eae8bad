package sdk

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
)

// onceSubscriber hands out ds on the first Receive, then waits for ctx.
type onceSubscriber struct {
	once sync.Once
	ds   []Delivery
}

func (s *onceSubscriber) Receive(ctx context.Context, _ string, _ int) ([]Delivery, error) {
	var ds []Delivery
	s.once.Do(func() { ds = s.ds })
	if ds != nil {
		return ds, nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestDrainSparesHandlerThatReturned: at the drain deadline Run cancels
// the handlers still running (cause ErrShutdown) and releases their
// deliveries. A handler that had already returned is not running: it is
// settled by its result. Before, the drain cancelled it too, and its
// settlement, which reads the cause after the handler returned, released a
// job whose handler had failed permanently instead of dead-lettering it
// (the race the job timeout's cancel was spared by cancelUnless).
func TestDrainSparesHandlerThatReturned(t *testing.T) {
	runCtx, stopRun := context.WithCancel(t.Context())
	defer stopRun()
	bStarted := make(chan struct{})
	bCtx := make(chan context.Context, 1)
	var armed atomic.Bool
	a := &hookDelivery{m: &Message{ID: "a", Type: "job"}}
	a.onMessage = func() {
		// The first Message call after the handler returned is settle's,
		// before it reads the cause: the drain deadline passes now, and
		// its cancel reaches b (held after a) once it is done with a.
		if armed.CompareAndSwap(true, false) {
			stopRun() // Run drains, with a deadline already passed
			<-(<-bCtx).Done()
		}
	}
	b := &hookDelivery{m: &Message{ID: "b", Type: "job"}}
	bad := errors.New("invalid payload")
	h := HandlerFunc(func(ctx context.Context, d Delivery) error {
		if d.Message().ID == "b" {
			bCtx <- ctx
			close(bStarted)
			<-ctx.Done()
			return ctx.Err()
		}
		<-bStarted
		// Run is stopped once this handler has returned (onMessage): a
		// stop from here would let the 1 ns deadline pass while it still
		// runs, and interrupt it rightly.
		armed.Store(true)
		return Permanent(bad)
	})
	w, err := NewWorker(&onceSubscriber{ds: []Delivery{a, b}}, h, WorkerOptions{
		Queue: "q", Concurrency: 2, DrainTimeout: 1, Timeout: -1, HeartbeatInterval: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(runCtx); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.action != ActionDeadLetter {
		t.Errorf("a handler that failed permanently before the drain deadline was settled %s; want %s", a.action, ActionDeadLetter)
	}
}
