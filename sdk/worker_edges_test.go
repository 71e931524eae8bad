package sdk_test

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

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

// TestRunEndKeepsProcessSettlement: the end of Run does not cancel the
// settlement context a concurrent Process (or a handler a previous Run
// abandoned) is settling under. The Worker shares one settlement context
// among the settlements of a short window, Process's included, and Run
// cancelled it on return: an Ack under way then failed with
// context.Canceled.
func TestRunEndKeepsProcessSettlement(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	w, err := sdk.NewWorker(newFakeSub(), h, sdk.WorkerOptions{Queue: "q", Logger: quiet, DrainTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	d := &ctxAck{Delivery: newFake(1, "job"), entered: make(chan struct{}, 1), gate: make(chan struct{})}
	got := make(chan sdk.Settlement, 1)
	go func() { got <- w.Process(context.Background(), d) }()
	<-d.entered // Process's Ack holds the Worker's shared settlement context
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	close(d.gate)
	if s := <-got; s.Action != sdk.ActionAck || s.Err != nil {
		t.Fatalf("Process settled %s, err %v; want ack without error", s.Action, s.Err)
	}
}

// TestDrainReleasesPrefetchedAtOnce: a delivery received but not started
// when Run's context ends is released when the drain begins (ARCHITECTURE.md,
// "Shutdown": the Worker stops receiving, releases deliveries not yet
// started, gives running handlers DrainTimeout), not when a handler
// goroutine comes free: with every handler busy on a long job the prefetched
// delivery was held, its lease extended, for up to DrainTimeout, where
// another consumer could have run it.
func TestDrainReleasesPrefetchedAtOnce(t *testing.T) {
	sub := newFakeSub()
	gate := make(chan struct{})
	var open sync.Once
	defer open.Do(func() { close(gate) }) // also when the test fails
	started := make(chan struct{}, 1)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Message().Type == "long" {
			started <- struct{}{}
			<-gate // a long job: finishes within the drain deadline
		}
		return nil
	})
	w, err := sdk.NewWorker(sub, h, sdk.WorkerOptions{Queue: "q", Concurrency: 1, Prefetch: 1, DrainTimeout: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	long, waiting := newFake(1, "long"), newFake(1, "b")
	sub.ch <- long
	<-started
	sub.ch <- waiting
	for w.Health().Held != 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	waiting.Wait(t) // while the running job goes on
	open.Do(func() { close(gate) })
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if a := actions(waiting); len(a) != 1 || a[0] != string(sdk.ActionRelease) {
		t.Errorf("prefetched delivery: settlements %v, want [release]", a)
	}
	if a := actions(long); len(a) != 1 || a[0] != string(sdk.ActionAck) {
		t.Errorf("running delivery: settlements %v, want [ack]", a)
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

func (o goexitObserver) Start(ctx context.Context, d sdk.Delivery) context.Context {
	if o.inStart && d.Message().Type == "exit" {
		runtime.Goexit()
	}
	return ctx
}

func (o goexitObserver) Settled(_ context.Context, d sdk.Delivery, _ sdk.Settlement) {
	if !o.inStart && d.Message().Type == "exit" {
		runtime.Goexit()
	}
}

// TestObserverStartGoexitSettles: an observer's Start that calls
// runtime.Goexit ends the handler goroutine as a handler's Goexit does; the
// delivery is settled as one (a retry of a *PanicError of ErrGoexit) rather
// than dropped unsettled: its slot was freed and its lease left to run out,
// so it came back an attempt later.
func TestObserverStartGoexitSettles(t *testing.T) {
	sub := newFakeSub()
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Observers: []sdk.Observer{goexitObserver{inStart: true}}})
	jobs := []*berthtest.Delivery{newFake(1, "exit"), newFake(1, "ok")}
	for _, f := range jobs {
		sub.ch <- f
	}
	for i, want := range []sdk.Action{sdk.ActionRetry, sdk.ActionAck} {
		if c := jobs[i].Wait(t); c.Action != want || (want == sdk.ActionRetry && !errors.Is(c.Cause, sdk.ErrGoexit)) {
			t.Errorf("job %d settled %s (cause %v), want %s", i, c.Action, c.Cause, want)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// autoAsync is a delivery whose AckAsync acks at once.
type autoAsync struct{ *berthtest.Delivery }

func (d autoAsync) AckAsync(ctx context.Context, done func(error)) { done(d.Delivery.Ack(ctx)) }

// TestObserverSettledGoexitOnAckReporterFreesSlots: an observer's Settled
// that calls runtime.Goexit while a background ack (AsyncAcker) is reported
// ended the one goroutine that reports them and frees their slots: every
// later ack kept its slot, the Worker stopped receiving once they were all
// held, and Run ended at its drain deadline with ErrDrainTimeout.
func TestObserverSettledGoexitOnAckReporterFreesSlots(t *testing.T) {
	sub := newFakeSub()
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Prefetch: 1, DrainTimeout: 50 * time.Millisecond,
		SettleTimeout: 50 * time.Millisecond, Observers: []sdk.Observer{goexitObserver{}}})
	jobs := []*berthtest.Delivery{newFake(1, "exit"), newFake(1, "ok"), newFake(1, "exit"), newFake(1, "ok"), newFake(1, "ok")}
	for _, f := range jobs {
		sub.ch <- autoAsync{f}
		f.Wait(t) // one at a time: each needs a slot the ones before freed
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// tenantKey is a context key of TestProcessSettlesUnderItsOwnContextValues.
type tenantKey struct{}

// valueAck is a recording delivery whose Ack records the tenant its
// settlement context carries.
type valueAck struct {
	*berthtest.Delivery
	got any
}

func (d *valueAck) Ack(ctx context.Context) error {
	d.got = ctx.Value(tenantKey{})
	return d.Delivery.Ack(ctx)
}

// TestProcessSettlesUnderItsOwnContextValues: each Process call settles
// under its own context's values (a trace, a tenant). The Worker shared one
// settlement context among the settlements of a short window, made from the
// first call's context: a second call's Ack saw the first call's tenant.
// Its settlement context is still detached from the call's cancellation and
// bounded by SettleTimeout.
func TestProcessSettlesUnderItsOwnContextValues(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	w, err := sdk.NewWorker(newFakeSub(), h, sdk.WorkerOptions{Queue: "q", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"a", "b", "c"} {
		d := &valueAck{Delivery: newFake(1, "job")}
		ctx := context.WithValue(context.Background(), tenantKey{}, tenant)
		if s := w.Process(ctx, d); s.Action != sdk.ActionAck || s.Err != nil {
			t.Fatalf("tenant %s: settlement %s, err %v; want ack", tenant, s.Action, s.Err)
		}
		if d.got != tenant {
			t.Errorf("Process under tenant %q settled under tenant %v", tenant, d.got)
		}
	}
}
