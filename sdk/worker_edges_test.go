package sdk_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// ctxAck is a recording delivery whose Ack first waits for gate (when set)
// and then returns its context's error: it fails where the Worker gave it
// a settlement context that is already done.
type ctxAck struct {
	*berthtest.Delivery
	entered chan struct{} // signalled when Ack starts
	gate    chan struct{} // Ack waits for it to close; nil: no wait
}

func (d *ctxAck) Ack(ctx context.Context) error {
	if d.entered != nil {
		d.entered <- struct{}{}
	}
	if d.gate != nil {
		<-d.gate
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return d.Delivery.Ack(ctx)
}

// TestSettleTimeoutHugeDoesNotOverflow: a SettleTimeout near
// math.MaxInt64 (someone's "no bound") is a long bound, not an expired one.
// The shared settlement context's deadline was the monotonic now plus
// SettleTimeout, a Duration sum that wrapped to a deadline in the past:
// every settlement failed with context.DeadlineExceeded.
func TestSettleTimeoutHugeDoesNotOverflow(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	w, err := sdk.NewWorker(newFakeSub(), h, sdk.WorkerOptions{Queue: "q", Logger: quiet, SettleTimeout: math.MaxInt64})
	if err != nil {
		t.Fatal(err)
	}
	d := &ctxAck{Delivery: newFake(1, "job")}
	if s := w.Process(context.Background(), d); s.Action != sdk.ActionAck || s.Err != nil {
		t.Fatalf("settlement %s, err %v; want ack without error", s.Action, s.Err)
	}
}

// TestNewWorkerRefusesCapacityOverflow: Concurrency + Prefetch (the slot
// count) that overflows int, or that the Worker's slot index (int32) cannot
// hold, is refused by NewWorker with ErrInvalidOptions. Before, NewWorker
// accepted Concurrency math.MaxInt (Prefetch defaulting to it too) and Run
// panicked making a channel of a negative size.
func TestNewWorkerRefusesCapacityOverflow(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	for name, o := range map[string]sdk.WorkerOptions{
		"Concurrency MaxInt":          {Concurrency: math.MaxInt},
		"Prefetch MaxInt":             {Concurrency: 1, Prefetch: math.MaxInt},
		"sum past MaxInt32":           {Concurrency: math.MaxInt32, Prefetch: 1},
		"ReceiveLoops with overflown": {Concurrency: math.MaxInt / 2, Prefetch: math.MaxInt / 2, ReceiveLoops: 2},
	} {
		o.Queue, o.Logger = "q", quiet
		if _, err := sdk.NewWorker(newFakeSub(), h, o); !errors.Is(err, sdk.ErrInvalidOptions) {
			t.Errorf("%s: NewWorker = %v; want ErrInvalidOptions", name, err)
		}
	}
}

// TestReceiveLoopsBeyondSlots: ReceiveLoops above the slot count runs as
// many loops as there are slots (a loop beyond them could never hold one).
// Before, Run made a slice and a goroutine per loop: ReceiveLoops
// math.MaxInt panicked in Run (makeslice: len out of range).
func TestReceiveLoopsBeyondSlots(t *testing.T) {
	sub := newFakeSub()
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Prefetch: 1, ReceiveLoops: math.MaxInt})
	f := newFake(1, "job")
	sub.ch <- f
	if c := f.Wait(t); c.Action != sdk.ActionAck {
		t.Errorf("settled %s, want ack", c.Action)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// goexitObserver calls runtime.Goexit in Start or Settled for jobs of type
// "exit" (a test's t.FailNow from an observer does).
type goexitObserver struct{ inStart bool }
