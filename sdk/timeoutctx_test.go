package sdk_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

type timeoutCtxKey struct{}

// timeoutView is what a handler saw of its context around its job timeout.
type timeoutView struct {
	called     time.Time // just after the handler's first Deadline call
	deadline   time.Time
	hasDL      bool
	doneAt     time.Time // when the handler saw its context done
	err, cause error
	childErr   error // context.WithCancel child made before the timeout
	childCause error
	valueErr   error // context.WithValue child
	longErr    error // context.WithTimeout(ctx, an hour) child, made before
	longDL     time.Time
	lateErr    error // context.WithCancel child made after the timeout
}

// TestJobTimeoutContextReadsAsDeadline: at the job timeout the handler's
// context is done with Err context.DeadlineExceeded (the context package's
// contract for a passed deadline; drivers map it to a timeout error), its
// cause stays ErrJobTimeout, its Deadline is the job's, and contexts derived
// from it (before or after) report the same. Before, Err was
// context.Canceled and Deadline reported none.
func TestJobTimeoutContextReadsAsDeadline(t *testing.T) {
	b := newMemory(t, memory.Options{})
	rec := berthtest.NewRecorder()
	views := make(chan timeoutView, 1)
	const timeout = 200 * time.Millisecond
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Attempt() > 1 {
			return nil
		}
		var v timeoutView
		v.deadline, v.hasDL = ctx.Deadline()
		v.called = time.Now()
		child, cancel := context.WithCancel(ctx)
		defer cancel()
		long, cancelLong := context.WithTimeout(ctx, time.Hour)
		defer cancelLong()
		v.longDL, _ = long.Deadline()
		vctx := context.WithValue(ctx, timeoutCtxKey{}, 1)
		<-ctx.Done()
		v.doneAt = time.Now()
		<-child.Done()
		<-long.Done()
		late, cancelLate := context.WithCancel(ctx)
		defer cancelLate()
		v.err, v.cause = ctx.Err(), context.Cause(ctx)
		v.childErr, v.childCause = child.Err(), context.Cause(child)
		v.valueErr, v.longErr, v.lateErr = vctx.Err(), long.Err(), late.Err()
		views <- v
		return ctx.Err()
	})
	runWorker(t, b, h, sdk.WorkerOptions{Queue: "jobs", Timeout: timeout, Retry: fastRetry(), Observers: []sdk.Observer{rec}})
	publish(t, b, "jobs", &sdk.Message{Type: "slow"})
	all := rec.WaitFor(t, "the retry to be acked", func(all []berthtest.Record) bool {
		return len(all) > 0 && all[len(all)-1].Action == sdk.ActionAck
	})
	v := <-views

	if v.err != context.DeadlineExceeded {
		t.Errorf("ctx.Err() after the job timeout = %v, want context.DeadlineExceeded", v.err)
	}
	if !errors.Is(v.cause, sdk.ErrJobTimeout) {
		t.Errorf("context.Cause = %v, want ErrJobTimeout", v.cause)
	}
	if v.childErr != context.DeadlineExceeded || !errors.Is(v.childCause, sdk.ErrJobTimeout) {
		t.Errorf("WithCancel child: Err %v cause %v, want context.DeadlineExceeded and ErrJobTimeout", v.childErr, v.childCause)
	}
	if v.valueErr != context.DeadlineExceeded || v.longErr != context.DeadlineExceeded || v.lateErr != context.DeadlineExceeded {
		t.Errorf("derived contexts' Err: WithValue %v, WithTimeout(1h) %v, WithCancel after the timeout %v; want context.DeadlineExceeded",
			v.valueErr, v.longErr, v.lateErr)
	}
	if !v.hasDL {
		t.Fatal("ctx.Deadline() reports no deadline under a job timeout")
	}
	// The timeout counts from no later than the first Deadline call, and
	// the deadline reported is the one enforced.
	if v.deadline.After(v.called.Add(timeout)) {
		t.Errorf("Deadline %v is later than the first Deadline call + Timeout (%v)", v.deadline, v.called.Add(timeout))
	}
	if v.doneAt.Before(v.deadline) {
		t.Errorf("context done at %v, before its reported Deadline %v", v.doneAt, v.deadline)
	}
	if !v.longDL.Equal(v.deadline) {
		t.Errorf("WithTimeout(ctx, 1h).Deadline() = %v, want the job's earlier %v", v.longDL, v.deadline)
	}
	if first := all[0].Settlement; first.Action != sdk.ActionRetry || !errors.Is(first.Cause, sdk.ErrJobTimeout) {
		t.Errorf("timed-out attempt settled %s cause %v; want a retry caused by ErrJobTimeout", first.Action, first.Cause)
	}
}

// TestHandlerContextCancelledOtherwiseIsCanceled: every other end of the
// handler's context (shutdown, lease loss, the handler's return) keeps Err
// context.Canceled, with its own cause; without a timeout there is no
// Deadline.
func TestHandlerContextCancelledOtherwiseIsCanceled(t *testing.T) {
	type seen struct {
		err, cause error
		hasDL      bool
	}
	got := make(chan seen, 1)
	var kept context.Context
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Message().Type == "return" {
			kept = ctx
			_, ok := ctx.Deadline()
			got <- seen{hasDL: ok}
			return nil
		}
		<-ctx.Done()
		_, ok := ctx.Deadline()
		got <- seen{ctx.Err(), context.Cause(ctx), ok}
		return ctx.Err()
	})

	// Shutdown (Process's ctx ended), with a timeout set: Canceled.
	w, err := sdk.NewWorker(newFakeSub(), h, sdk.WorkerOptions{Queue: "q", Timeout: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.Process(ctx, newFake(1, "shutdown"))
	if s := <-got; s.err != context.Canceled || !errors.Is(s.cause, sdk.ErrShutdown) || !s.hasDL {
		t.Errorf("shutdown: Err %v cause %v deadline %v; want context.Canceled, ErrShutdown, the job's deadline", s.err, s.cause, s.hasDL)
	}

	// Lease lost, without a timeout: Canceled, no Deadline.
	sub := newFakeSub()
	f := newFake(1, "lost", failExtend(sdk.ErrLeaseLost))
	sub.ch <- f
	runWorker(t, sub, h, sdk.WorkerOptions{Timeout: -1, Lease: 40 * time.Millisecond, HeartbeatInterval: 10 * time.Millisecond})
	if s := <-got; s.err != context.Canceled || !errors.Is(s.cause, sdk.ErrLeaseLost) || s.hasDL {
		t.Errorf("lease lost: Err %v cause %v deadline %v; want context.Canceled, ErrLeaseLost, none", s.err, s.cause, s.hasDL)
	}

	// The handler returned: Canceled.
	w.Process(context.Background(), newFake(1, "return"))
	<-got
	if kept.Err() != context.Canceled {
		t.Errorf("context of a returned handler: Err %v, want context.Canceled", kept.Err())
	}
}

// TestProcessJobTimeoutContextReadsAsDeadline: Process enforces the timeout
// with a timer of its own; its handler's context reads the same as Run's.
func TestProcessJobTimeoutContextReadsAsDeadline(t *testing.T) {
	var dl time.Time
	var ok bool
	var errAt error
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		dl, ok = ctx.Deadline()
		<-ctx.Done()
		errAt = ctx.Err()
		return ctx.Err()
	})
	w, err := sdk.NewWorker(newFakeSub(), h, sdk.WorkerOptions{Queue: "q", Timeout: 20 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	s := w.Process(context.Background(), newFake(1, "slow"))
	if !ok || dl.Before(before) {
		t.Errorf("Deadline() = %v, %v; want the job's deadline", dl, ok)
	}
	if errAt != context.DeadlineExceeded || !errors.Is(s.Cause, sdk.ErrJobTimeout) {
		t.Errorf("Err %v, settled with cause %v; want context.DeadlineExceeded and ErrJobTimeout", errAt, s.Cause)
	}
}
