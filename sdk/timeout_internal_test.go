package sdk

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hookDelivery is a Delivery whose Message calls onMessage first, and which
// records its settlement.
type hookDelivery struct {
	m         *Message
	onMessage func()
	mu        sync.Mutex
	action    Action
}

func (d *hookDelivery) Message() *Message {
	if d.onMessage != nil {
		d.onMessage()
	}
	return d.m
}
func (d *hookDelivery) Attempt() int                                     { return 1 }
func (d *hookDelivery) Queue() string                                    { return "q" }
func (d *hookDelivery) ExtendLease(context.Context, time.Duration) error { return nil }
func (d *hookDelivery) settled(a Action) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.action = a
	return nil
}
func (d *hookDelivery) Ack(context.Context) error { return d.settled(ActionAck) }
func (d *hookDelivery) Retry(context.Context, time.Duration, error) error {
	return d.settled(ActionRetry)
}
func (d *hookDelivery) DeadLetter(context.Context, error) error { return d.settled(ActionDeadLetter) }

// TestWatchdogSparesHandlerThatReturned: the watchdog checks that a handler
// still runs (settling unset), then cancels it at its timeout; a handler
// that returns between the two (here, while the watchdog reads the job's
// type) has already been judged by its result, and a timeout must not
// replace it. Before, the watchdog cancelled it anyway with ErrJobTimeout,
// and the settlement, which reads the cause after the handler returned,
// turned its Permanent error into a timeout retry (or any error into a
// timeout cause).
func TestWatchdogSparesHandlerThatReturned(t *testing.T) {
	w, err := NewWorker(idleSubscriber{}, HandlerFunc(func(context.Context, Delivery) error { return nil }),
		WorkerOptions{Queue: "q", Timeout: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	d := &hookDelivery{m: &Message{ID: "a", Type: "job"}}
	tk := &task{d: d, begun: true, started: 1} // running since long past its timeout
	tk.hc.parent = context.Background()
	var once sync.Once
	d.onMessage = func() {
		// The watchdog saw the handler running and looks up its timeout:
		// the handler returns now, as process marks it.
		once.Do(func() { tk.settling.Store(true) })
	}
	// A second, not started, task after it: the watchdog reads its type
	// once it is done with the first.
	passed := make(chan struct{})
	var passedOnce sync.Once
	next := &task{d: &hookDelivery{m: &Message{ID: "b", Type: "job"}, onMessage: func() { passedOnce.Do(func() { close(passed) }) }}}
	held := make([]atomic.Pointer[task], 2)
	held[0].Store(tk)
	held[1].Store(next)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.watchdog(held, stop)
	}()
	<-passed
	close(stop)
	<-done

	if cause := context.Cause(&tk.hc); cause != nil {
		t.Errorf("a handler that returned before the timeout fired was cancelled with %v", cause)
	}
	bad := errors.New("invalid payload")
	s := w.settle(context.Background(), &tk.hc, d, Permanent(bad), false)
	if s.Action != ActionDeadLetter || !errors.Is(s.Cause, bad) || errors.Is(s.Cause, ErrJobTimeout) {
		t.Errorf("settled %s with cause %v; want dead-lettered by the handler's permanent error", s.Action, s.Cause)
	}
}

// extendDelivery is a hookDelivery whose ExtendLease calls onExtend.
type extendDelivery struct {
	hookDelivery
	onExtend func(n int) error
	calls    int
}

func (d *extendDelivery) ExtendLease(context.Context, time.Duration) error {
	d.calls++
	return d.onExtend(d.calls)
}

// TestExtensionRetryStopsAtJobTimeout: an extension that fails and is
// retried stops retrying once the handler ran past its timeout: the
// heartbeat stops extending a timed-out job's lease so that a handler
// ignoring its context does not hold the job. Before, the heartbeat skipped
// the timed-out job, but an extension already retrying went on and extended
// its lease once more.
func TestExtensionRetryStopsAtJobTimeout(t *testing.T) {
	w, err := NewWorker(idleSubscriber{}, HandlerFunc(func(context.Context, Delivery) error { return nil }),
		WorkerOptions{Queue: "q", Lease: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	d := &extendDelivery{hookDelivery: hookDelivery{m: &Message{ID: "a", Type: "job"}}}
	tk := &task{d: d, begun: true}
	tk.hc.parent = context.Background()
	d.onExtend = func(n int) error {
		if n == 1 {
			// The watchdog times the handler out while this attempt is
			// under way, and the attempt fails (a connection reset).
			tk.timedOut.Store(true)
			tk.hc.cancel(ErrJobTimeout)
			return errors.New("connection reset")
		}
		return nil
	}
	w.extend(context.Background(), tk, time.Now(), make(chan struct{}))
	if d.calls != 1 {
		t.Errorf("the lease of a timed-out job was extended again (%d ExtendLease calls, want 1)", d.calls)
	}
}
