package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// runWorker runs a Worker on sub until stop is called; stop returns Run's error.
func runWorker(t *testing.T, sub sdk.Subscriber, h sdk.Handler, opts sdk.WorkerOptions) (stop func() error) {
	t.Helper()
	if opts.Queue == "" {
		opts.Queue = "q"
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	w, err := sdk.NewWorker(sub, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() { stop() })
	return stop
}

func waitSettled(t *testing.T, f *berthtest.Delivery) {
	t.Helper()
	f.Wait(t)
}

func TestSettlementTable(t *testing.T) {
	transient := errors.New("connection reset")
	policy := sdk.RetryPolicy{MaxAttempts: 3, Backoff: sdk.Backoff{Base: 100 * time.Millisecond, Max: time.Second, Jitter: -1}}
	cases := []struct {
		name      string
		attempt   int
		releaser  bool
		err       error
		panicWith any
		want      string
		wantDelay time.Duration
		wantClass sdk.ErrorClass
	}{
		{name: "nil acks", attempt: 1, want: "ack"},
		{name: "permanent dead-letters on first attempt", attempt: 1, err: sdk.Permanent(transient), want: "dead_letter", wantClass: sdk.ClassPermanent},
		{name: "retry-after releases when possible", attempt: 2, releaser: true, err: sdk.RetryAfter(transient, 3*time.Second), want: "release", wantDelay: 3 * time.Second, wantClass: sdk.ClassRetryAfter},
		{name: "retry-after retries otherwise", attempt: 2, err: sdk.RetryAfter(nil, 3*time.Second), want: "retry", wantDelay: 3 * time.Second, wantClass: sdk.ClassRetryAfter},
		{name: "retry-after never dead-letters", attempt: 9, err: sdk.RetryAfter(nil, time.Second), want: "retry", wantDelay: time.Second, wantClass: sdk.ClassRetryAfter},
		{name: "transient retries with backoff", attempt: 2, err: transient, want: "retry", wantDelay: 200 * time.Millisecond, wantClass: sdk.ClassTransient},
		{name: "transient at max attempts dead-letters", attempt: 3, err: transient, want: "dead_letter", wantClass: sdk.ClassTransient},
		{name: "panic is transient", attempt: 1, panicWith: "boom", want: "retry", wantDelay: 100 * time.Millisecond, wantClass: sdk.ClassPanic},
		{name: "panic at max attempts dead-letters", attempt: 3, panicWith: fmt.Errorf("boom"), want: "dead_letter", wantClass: sdk.ClassPanic},
		// A panic is a bug whatever its value: not a verdict of the handler.
		{name: "panic with a permanent value is a panic", attempt: 1, panicWith: sdk.Permanent(transient), want: "retry", wantDelay: 100 * time.Millisecond, wantClass: sdk.ClassPanic},
		{name: "panic with a retry-after value is a panic", attempt: 3, releaser: true, panicWith: sdk.RetryAfter(transient, time.Second), want: "dead_letter", wantClass: sdk.ClassPanic},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sub := newFakeSub()
			f := newFake(tc.attempt, "job")
			d := f.WithoutRelease()
			if tc.releaser {
				d = f
			}
			var got sdk.Settlement
			var gotMu sync.Mutex
			ob := observer{settled: func(_ context.Context, _ sdk.Delivery, s sdk.Settlement) {
				gotMu.Lock()
				got = s
				gotMu.Unlock()
			}}
			h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
				if tc.panicWith != nil {
					panic(tc.panicWith)
				}
				return tc.err
			})
			stop := runWorker(t, sub, h, sdk.WorkerOptions{Retry: policy, Observers: []sdk.Observer{ob}})
			sub.ch <- d
			waitSettled(t, f)
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if a := actions(f); len(a) != 1 || a[0] != tc.want {
				t.Fatalf("actions %v, want exactly [%s]", a, tc.want)
			}
			if first(f).Delay != tc.wantDelay {
				t.Errorf("delay %v, want %v", first(f).Delay, tc.wantDelay)
			}
			gotMu.Lock()
			defer gotMu.Unlock()
			if got.Class != tc.wantClass || string(got.Action) != tc.want {
				t.Errorf("observer saw %+v, want action %s class %q", got, tc.want, tc.wantClass)
			}
			if tc.want == "dead_letter" && first(f).Cause == nil {
				t.Error("dead letter without its cause")
			}
		})
	}
}

func TestRetryPolicyByType(t *testing.T) {
	sub := newFakeSub()
	fast, slow := newFake(2, "fast"), newFake(2, "slow")
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return errors.New("flaky") })
	runWorker(t, sub, h, sdk.WorkerOptions{
		Retry:       sdk.RetryPolicy{MaxAttempts: 5, Backoff: sdk.Backoff{Base: time.Second, Jitter: -1}},
		RetryByType: map[string]sdk.RetryPolicy{"fast": {MaxAttempts: 2}},
	})
	sub.ch <- fast.WithoutRelease()
	sub.ch <- slow.WithoutRelease()
	waitSettled(t, fast)
	waitSettled(t, slow)
	if a := actions(fast); a[0] != "dead_letter" {
		t.Errorf("type with MaxAttempts 2 at attempt 2: %v, want dead_letter", a)
	}
	if a := actions(slow); a[0] != "retry" || first(slow).Delay != 2*time.Second {
		t.Errorf("default policy at attempt 2: %v after %v, want retry after 2s", a, first(slow).Delay)
	}
}

// A RetryByType entry that sets only some fields takes the others from the
// Worker's Retry, as a zero TimeoutByType entry takes the Worker's Timeout:
// an entry that slows one type's backoff does not also cut its attempts to
// the package default.
func TestRetryByTypeInheritsWorkerRetry(t *testing.T) {
	sub := newFakeSub()
	d := newFake(5, "slowish")
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return errors.New("flaky") })
	runWorker(t, sub, h, sdk.WorkerOptions{
		Retry:       sdk.RetryPolicy{MaxAttempts: 10, Backoff: sdk.Backoff{Base: time.Second, Max: time.Hour, Jitter: -1}},
		RetryByType: map[string]sdk.RetryPolicy{"slowish": {Backoff: sdk.Backoff{Base: 3 * time.Second}}},
	})
	sub.ch <- d.WithoutRelease()
	waitSettled(t, d)
	// Attempt 5 of the Worker's 10: retried after 3s·2^4, without jitter.
	if a := actions(d); a[0] != "retry" || first(d).Delay != 48*time.Second {
		t.Errorf("slowish at attempt 5: %v after %v, want retry after 48s (MaxAttempts 10, Max 1h and no jitter from Retry)", a, first(d).Delay)
	}
}

type observer struct {
	start   func(ctx context.Context, d sdk.Delivery) context.Context
	settled func(ctx context.Context, d sdk.Delivery, s sdk.Settlement)
}

func (o observer) Start(ctx context.Context, d sdk.Delivery) context.Context {
	if o.start != nil {
		return o.start(ctx, d)
	}
	return ctx
}

func (o observer) Settled(ctx context.Context, d sdk.Delivery, s sdk.Settlement) {
	if o.settled != nil {
		o.settled(ctx, d, s)
	}
}

func TestBoundedConcurrency(t *testing.T) {
	const n, conc = 200, 4
	sub := newFakeSub()
	var running, peak atomic.Int32
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		r := running.Add(1)
		for {
			p := peak.Load()
			if r <= p || peak.CompareAndSwap(p, r) {
				break
			}
		}
		time.Sleep(time.Millisecond)
		running.Add(-1)
		return nil
	})
	runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: conc, Prefetch: 2})
	fs := make([]*berthtest.Delivery, n)
	for i := range fs {
		fs[i] = newFake(1, "job")
		sub.ch <- fs[i].WithoutRelease()
	}
	for _, f := range fs {
		waitSettled(t, f)
	}
	if p := peak.Load(); p > conc || p < 2 {
		t.Fatalf("peak concurrency %d, want between 2 and %d", p, conc)
	}
}

func TestShutdownReleasesInterruptedAndUnstartedWork(t *testing.T) {
	sub := newFakeSub()
	started := make(chan struct{}, 1)
	var cause atomic.Value
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		started <- struct{}{}
		<-ctx.Done()
		cause.Store(context.Cause(ctx))
		return ctx.Err()
	})
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Prefetch: 1, DrainTimeout: 50 * time.Millisecond})
	running, waiting := newFake(2, "job"), newFake(1, "job")
	sub.ch <- running
	<-started
	sub.ch <- waiting
	time.Sleep(20 * time.Millisecond) // let the receiver take the second one into its buffer
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := cause.Load(); got != sdk.ErrShutdown {
		t.Errorf("handler ctx cause %v, want ErrShutdown", got)
	}
	if a := actions(running); len(a) != 1 || a[0] != "release" {
		t.Errorf("interrupted delivery: %v, want [release]", a)
	}
	if a := actions(waiting); len(a) > 1 || (len(a) == 1 && a[0] != "release") {
		t.Errorf("unstarted delivery: %v, want [release] or untouched", a)
	}
}

// TestShutdownRunsUnstartedWorkWithoutRelease (issue 15): a delivery that
// cannot be handed back without consuming an attempt (no Releaser, as on
// SQS) and was received but not started when the drain began is run within
// the drain deadline and acked, not retried; a Releaser's is still
// released (TestShutdownReleasesInterruptedAndUnstartedWork).
func TestShutdownRunsUnstartedWorkWithoutRelease(t *testing.T) {
	sub := newFakeSub()
	gate := make(chan struct{})
	started := make(chan struct{}, 2)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		started <- struct{}{}
		if d.Attempt() == 2 { // the running one: holds its slot until the drain began
			<-gate
		}
		return nil
	})
	w, err := sdk.NewWorker(sub, h, sdk.WorkerOptions{Queue: "q", Concurrency: 1, Prefetch: 1, DrainTimeout: time.Minute, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	running, waiting := newFake(2, "job"), newFake(1, "job")
	sub.ch <- running.WithoutRelease()
	<-started
	sub.ch <- waiting.WithoutRelease()
	for len(sub.ch) > 0 { // the receiver takes it into the Worker's buffer
		time.Sleep(time.Millisecond)
	}
	cancel()
	for w.Health().State != sdk.StateDraining {
		time.Sleep(time.Millisecond)
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if a := actions(running); len(a) != 1 || a[0] != "ack" {
		t.Errorf("running delivery: %v, want [ack]", a)
	}
	if a := actions(waiting); len(a) != 1 || a[0] != "ack" {
		t.Errorf("delivery not started when the drain began: %v, want [ack] (run, not retried: a Retry would cost it an attempt)", a)
	}
}

// longPollSub is a fakeSub whose Receive is a long poll of a server that
// counts every receive ([sdk.LongPoller]), like SQS.
type longPollSub struct {
	*fakeSub
	wait time.Duration
}

func (s longPollSub) ReceiveWait() time.Duration { return s.wait }

// idlePollSub is a LongPoller on an empty queue: each Receive waits wait
// and returns nothing; polls gets a signal per Receive.
type idlePollSub struct {
	wait     time.Duration
	polls    chan struct{}
	stopping atomic.Bool  // set by the test just before it stops the Worker
	late     atomic.Int32 // polls started once stopping was set
}

func (s *idlePollSub) ReceiveWait() time.Duration { return s.wait }

func (s *idlePollSub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	if s.stopping.Load() {
		s.late.Add(1)
	}
	s.polls <- struct{}{}
	select {
	case <-time.After(s.wait):
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestShutdownFinishesLongPoll (issue 15): when Run's context ends while a
// LongPoller's Receive is in flight, the Receive is not cancelled: what the
// server hands it afterwards is run and acked. Cancelled, the answer would
// be lost after SQS counted the receive, and the message would come back
// one attempt later (the SQS rolling-restart scenario's attempt-2 charges).
// A poll that gets no answer ends after ReceiveWait plus a second (at most
// LongPollGrace).
func TestShutdownFinishesLongPoll(t *testing.T) {
	ran := make(chan struct{}, 1)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		ran <- struct{}{}
		return nil
	})
	// start runs a Worker of one slot on sub until the returned stop, which
	// cancels Run's context and returns what Run returned.
	start := func(sub sdk.Subscriber) (stop func() <-chan error) {
		w, err := sdk.NewWorker(sub, h, sdk.WorkerOptions{Queue: "q", Concurrency: 1, DrainTimeout: time.Minute, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		return func() <-chan error { cancel(); return done }
	}

	sub := longPollSub{fakeSub: newFakeSub(), wait: 100 * time.Millisecond}
	stop := start(sub)
	<-sub.receiving // the long poll is in flight
	done := stop()
	time.Sleep(20 * time.Millisecond)
	late := newFake(1, "job")
	sub.ch <- late.WithoutRelease() // the server's answer, after the shutdown began
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if a := actions(late); len(a) != 1 || a[0] != "ack" {
		t.Fatalf("delivery answered to the poll in flight at shutdown: %v, want [ack] (run, not lost to a cancelled poll)", a)
	}
	if len(sub.ch) != 0 {
		t.Fatal("the answer was left unreceived")
	}

	// A poll that comes back empty (its wait ran out) is the last: no new
	// poll starts under the grace the shutdown gave the one in flight.
	// Before, the loop started poll after poll until the grace ran out, so
	// every idle SQS Worker's drain took the whole grace.
	idle := &idlePollSub{wait: 50 * time.Millisecond, polls: make(chan struct{}, 100)}
	stop = start(idle)
	<-idle.polls
	// Counted from here, not from the first poll: a slow test goroutine
	// would otherwise see the polls the running Worker rightly started.
	idle.stopping.Store(true)
	if err := <-stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := idle.late.Load(); n > 1 {
		t.Errorf("%d polls started after the shutdown began, want at most the one in flight", n)
	}

	// A poll nobody answers ends on its own.
	stop = start(sub)
	<-sub.receiving
	select {
	case err := <-stop():
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return: the unanswered long poll was never cut off")
	}
}

func TestShutdownLetsHandlersFinish(t *testing.T) {
	sub := newFakeSub()
	started := make(chan struct{})
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		close(started)
		time.Sleep(30 * time.Millisecond)
		return ctx.Err() // nil: the drain deadline has not passed
	})
	stop := runWorker(t, sub, h, sdk.WorkerOptions{DrainTimeout: 10 * time.Second})
	f := newFake(1, "job")
	sub.ch <- f.WithoutRelease()
	<-started
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if a := actions(f); len(a) != 1 || a[0] != "ack" {
		t.Fatalf("actions %v, want [ack]: a handler finishing within the drain deadline is acked", a)
	}
}

// runUntilExtended is a handler that runs until f's lease has been extended
// n times, or fails the job after 5 s, far longer than the leases of the
// tests that use it and well within berthtest.WaitTimeout. Waiting for the
// extensions, not sleeping a fixed time, keeps a stalled heartbeat goroutine
// on a loaded machine from failing the test.
func runUntilExtended(f *berthtest.Delivery, n int) sdk.Handler {
	const limit = 5 * time.Second
	return sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		deadline := time.Now().Add(limit)
		for f.Extensions() < n {
			if time.Now().After(deadline) {
				return fmt.Errorf("%d extensions after %v, want %d", f.Extensions(), limit, n)
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	})
}

func TestHeartbeatExtendsLongJobs(t *testing.T) {
	sub := newFakeSub()
	f := newFake(1, "job")
	runWorker(t, sub, runUntilExtended(f, 2), sdk.WorkerOptions{Lease: 30 * time.Millisecond, HeartbeatInterval: 10 * time.Millisecond})
	sub.ch <- f.WithoutRelease()
	waitSettled(t, f)
	n := f.Extensions()
	if n < 2 {
		t.Fatalf("lease extended %d times during a long job", n)
	}
	if a := actions(f); a[0] != "ack" {
		t.Fatalf("actions %v", a)
	}
}

func TestLeaseLostCancelsHandlerAndDoesNotSettle(t *testing.T) {
	sub := newFakeSub()
	var cause atomic.Value
	done := make(chan sdk.Settlement, 1)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		<-ctx.Done()
		cause.Store(context.Cause(ctx))
		return nil // even a success must not be acked once the lease is gone
	})
	ob := observer{settled: func(_ context.Context, _ sdk.Delivery, s sdk.Settlement) { done <- s }}
	runWorker(t, sub, h, sdk.WorkerOptions{Lease: 30 * time.Millisecond, HeartbeatInterval: 10 * time.Millisecond, Observers: []sdk.Observer{ob}})
	f := newFake(1, "job", failExtend(fmt.Errorf("token mismatch: %w", sdk.ErrLeaseLost)))
	sub.ch <- f.WithoutRelease()
	waitLeaseLost(t, done, "handler never cancelled")
	if got := cause.Load(); got != sdk.ErrLeaseLost {
		t.Errorf("cause %v, want ErrLeaseLost", got)
	}
	if a := actions(f); len(a) != 0 {
		t.Fatalf("a delivery whose lease was lost was settled: %v", a)
	}
}

// waitLeaseLost waits for the next settlement and fails unless it is a lost
// lease; stuck says what it means when none comes.
func waitLeaseLost(t *testing.T, settled <-chan sdk.Settlement, stuck string) {
	t.Helper()
	select {
	case s := <-settled:
		if s.Action != sdk.ActionLeaseLost {
			t.Fatalf("settlement %v, want lease_lost", s.Action)
		}
	case <-time.After(10 * time.Second):
		t.Fatal(stuck)
	}
}

func TestExtensionFailuresPastLeaseLoseIt(t *testing.T) {
	sub := newFakeSub()
	done := make(chan sdk.Settlement, 1)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error { <-ctx.Done(); return ctx.Err() })
	ob := observer{settled: func(_ context.Context, _ sdk.Delivery, s sdk.Settlement) { done <- s }}
	runWorker(t, sub, h, sdk.WorkerOptions{Lease: 40 * time.Millisecond, HeartbeatInterval: 10 * time.Millisecond, Observers: []sdk.Observer{ob}})
	f := newFake(1, "job", failExtend(errors.New("network unreachable")))
	sub.ch <- f.WithoutRelease()
	waitLeaseLost(t, done, "a lease whose extensions kept failing was never given up")
}

// One delivery whose extension hangs (a connection that stopped answering)
// must not hold back the others' extensions: each would otherwise run past
// its lease unextended while the heartbeat waited, and another consumer
// could take it and run it twice.
func TestHungExtensionDoesNotStallOthers(t *testing.T) {
	sub := newFakeSub()
	settled := make(chan sdk.Settlement, 2)
	release := make(chan struct{})
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Message().ID == "healthy" {
			<-release
			return nil
		}
		<-ctx.Done()
		return ctx.Err()
	})
	ob := observer{settled: func(_ context.Context, d sdk.Delivery, s sdk.Settlement) { settled <- s }}
	runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 2, Lease: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		SettleTimeout: 10 * time.Second, Observers: []sdk.Observer{ob}})
	hung := newFake(1, "job", berthtest.OnExtend(func(ctx context.Context, _ time.Duration) error {
		<-ctx.Done() // answers only when given up on
		return ctx.Err()
	}))
	healthy := newFake(2, "job")
	healthy.Message().ID = "healthy"
	sub.ch <- hung.WithoutRelease()
	sub.ch <- healthy.WithoutRelease()
	waitLeaseLost(t, settled, "a lease whose extension hangs was never given up")
	// By now the hung extension has been in flight for a lease or more.
	before := healthy.Extensions()
	deadline := time.Now().Add(10 * time.Second)
	for healthy.Extensions() < before+3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	waitSettled(t, healthy)
	if n := healthy.Extensions(); n < before+3 {
		t.Fatalf("the healthy delivery was extended %d times, %d of them after the other's extension hung", n, n-before)
	}
	if a := actions(healthy); len(a) != 1 || a[0] != "ack" {
		t.Fatalf("healthy delivery: actions %v, want [ack]", a)
	}
}

// A failed extension is tried again at once, not a tick later: a lease
// survives a reset connection with most of its time left.
func TestFailedExtensionRetriedSoon(t *testing.T) {
	sub := newFakeSub()
	var mu sync.Mutex
	var calls []time.Time
	f := newFake(1, "job", berthtest.OnExtend(func(context.Context, time.Duration) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, time.Now())
		if len(calls) == 1 {
			return fmt.Errorf("extend: connection reset by peer: %w", sdk.ErrUnavailable)
		}
		return nil
	}))
	release := make(chan struct{})
	runWorker(t, sub, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}), sdk.WorkerOptions{Lease: 6 * time.Second, HeartbeatInterval: 2 * time.Second})
	sub.ch <- f.WithoutRelease()
	deadline := time.Now().Add(15 * time.Second)
	for f.Extensions() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	waitSettled(t, f)
	mu.Lock()
	defer mu.Unlock()
	if len(calls) < 2 {
		t.Fatalf("%d extension calls", len(calls))
	}
	// The next tick is a second (HeartbeatInterval/2) after the failure;
	// the retry comes after the first pause, 50 ms.
	if gap := calls[1].Sub(calls[0]); gap >= 900*time.Millisecond {
		t.Errorf("a failed extension was tried again after %v, as late as the next tick", gap)
	}
	if a := actions(f); len(a) != 1 || a[0] != "ack" {
		t.Fatalf("actions %v, want [ack]", a)
	}
}

func TestRunReturnsWhenBrokerCloses(t *testing.T) {
	sub := newFakeSub()
	sub.errs <- fmt.Errorf("receive: %w", sdk.ErrClosed)
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{Queue: "q", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); !errors.Is(err, sdk.ErrClosed) {
		t.Fatalf("Run = %v, want ErrClosed", err)
	}
	select {
	case <-sub.flushed:
	default:
		t.Error("Run did not flush the broker's buffered settlements")
	}
}

func TestRunReturnsOnPermanentReceiveErrors(t *testing.T) {
	for _, cause := range []error{sdk.ErrNotFound, &sdk.QueueNameError{Name: "x"}} {
		sub := newFakeSub()
		sub.errs <- fmt.Errorf("receive: %w", cause)
		w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{Queue: "q", Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Run(context.Background()); !errors.Is(err, cause) {
			t.Errorf("Run = %v, want it to stop on %v instead of retrying forever", err, cause)
		}
	}
}

func TestLeaseAndHeartbeatMustAgree(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	if _, err := sdk.NewWorker(newFakeSub(), h, sdk.WorkerOptions{Queue: "q", Lease: time.Second, HeartbeatInterval: time.Second}); err == nil {
		t.Error("a heartbeat as slow as the lease was accepted: long jobs would run twice")
	}
	if _, err := sdk.NewWorker(newFakeSub(), h, sdk.WorkerOptions{Queue: "q", Lease: -time.Second}); err == nil {
		t.Error("a negative lease was accepted")
	}
	// The broker's lease is the default, so the heartbeat keeps up with it.
	sub := newFakeSub()
	sub.lease = 40 * time.Millisecond
	f := newFake(1, "job")
	runWorker(t, reporting{sub}, runUntilExtended(f, 3), sdk.WorkerOptions{})
	sub.ch <- f.WithoutRelease()
	waitSettled(t, f)
	if n := f.Extensions(); n < 3 {
		t.Fatalf("%d extensions in 3 broker leases: the Worker did not take the broker's lease as its own", n)
	}
	if a := actions(f); len(a) != 1 || a[0] != "ack" {
		t.Fatalf("actions %v, want [ack]", a)
	}
}

// reporting is a fakeSub that reports its lease.
type reporting struct{ *fakeSub }

func (r reporting) Lease() time.Duration { return r.lease }

func TestHeartbeatIgnoresSettledDeliveries(t *testing.T) {
	sub := newFakeSub()
	var failed atomic.Int32
	ob := leaseObserver{extended: func(err error) {
		if err != nil {
			failed.Add(1)
		}
	}}
	runWorker(t, sub, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		time.Sleep(30 * time.Millisecond)
		return nil
	}), sdk.WorkerOptions{Lease: 20 * time.Millisecond, HeartbeatInterval: 5 * time.Millisecond, Observers: []sdk.Observer{ob}})
	f := newFake(1, "job", failExtend(sdk.ErrAlreadySettled)) // as if the ack won the race
	sub.ch <- f.WithoutRelease()
	waitSettled(t, f)
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d extensions of an already settled delivery reported as failures", n)
	}
	if a := actions(f); len(a) != 1 || a[0] != "ack" {
		t.Fatalf("actions %v: an ErrAlreadySettled from the heartbeat must not cost the delivery its settlement", a)
	}
}

type leaseObserver struct {
	observer
	extended func(err error)
}

func (o leaseObserver) LeaseExtended(_ context.Context, _ sdk.Delivery, _ time.Duration, err error) {
	o.extended(err)
}

func TestReceiveErrorsAreRetried(t *testing.T) {
	sub := newFakeSub()
	sub.errs <- errors.New("temporary outage")
	sub.errs <- errors.New("temporary outage")
	runWorker(t, sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{})
	f := newFake(1, "job")
	sub.ch <- f.WithoutRelease()
	waitSettled(t, f)
}

func TestRunTwiceAtOnceIsRefused(t *testing.T) {
	sub := newFakeSub()
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{Queue: "q", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	<-sub.receiving // the first Run is under way
	if err := w.Run(ctx); !errors.Is(err, sdk.ErrWorkerRunning) {
		t.Errorf("second Run = %v, want ErrWorkerRunning", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNewWorkerValidates(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	if _, err := sdk.NewWorker(newFakeSub(), h, sdk.WorkerOptions{Queue: "bad queue"}); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("invalid queue: %v", err)
	}
	if _, err := sdk.NewWorker(nil, h, sdk.WorkerOptions{Queue: "q"}); err == nil {
		t.Error("nil subscriber accepted")
	}
	if _, err := sdk.NewWorker(newFakeSub(), h, sdk.WorkerOptions{Queue: "q", Concurrency: -1}); err == nil {
		t.Error("negative concurrency accepted")
	}
}

func TestCorrelationIDReachesHandler(t *testing.T) {
	sub := newFakeSub()
	got := make(chan string, 1)
	runWorker(t, sub, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		got <- sdk.CorrelationID(ctx)
		return nil
	}), sdk.WorkerOptions{})
	f := newFake(1, "job")
	f.Message().CorrelationID = "corr-42"
	sub.ch <- f.WithoutRelease()
	if id := <-got; id != "corr-42" {
		t.Fatalf("correlation ID in handler ctx %q", id)
	}
}

func TestJitterIsDeterministicWithSeed(t *testing.T) {
	delays := func() []time.Duration {
		sub := newFakeSub()
		var mu sync.Mutex
		var out []time.Duration
		ob := observer{settled: func(_ context.Context, _ sdk.Delivery, s sdk.Settlement) {
			mu.Lock()
			out = append(out, s.Delay)
			mu.Unlock()
		}}
		stop := runWorker(t, sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return errors.New("x") }),
			sdk.WorkerOptions{Concurrency: 1, Prefetch: 1, Rand: rand.New(rand.NewPCG(7, 7)), Observers: []sdk.Observer{ob},
				Retry: sdk.RetryPolicy{MaxAttempts: 10, Backoff: sdk.Backoff{Base: time.Second, Jitter: 0.5}}})
		for i := 1; i <= 4; i++ {
			f := newFake(i, "job")
			sub.ch <- f.WithoutRelease()
			waitSettled(t, f)
		}
		stop()
		return out
	}
	a, b := delays(), delays()
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("same seed, different delays: %v vs %v", a, b)
	}
	for i, d := range a {
		lo := time.Second << i
		if d < lo || d > lo+lo/2 {
			t.Errorf("attempt %d delay %v outside [%v, %v]", i+1, d, lo, lo+lo/2)
		}
	}
}

// TestProcessSettlesLikeRun: Process applies the settlement rules to a
// delivery the caller received, and a context that ends while the handler
// runs cancels it with ErrShutdown and releases the delivery, as Run's drain
// does.
func TestProcessSettlesLikeRun(t *testing.T) {
	w, err := sdk.NewWorker(newFakeSub(), sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Message().Type == "block" {
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), sdk.ErrShutdown) {
				return fmt.Errorf("cause %v", context.Cause(ctx))
			}
			return ctx.Err()
		}
		return sdk.Permanent(errors.New("bad"))
	}), sdk.WorkerOptions{Queue: "q", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	f := newFake(1, "bad")
	if s := w.Process(context.Background(), f); s.Action != sdk.ActionDeadLetter || first(f).Action != sdk.ActionDeadLetter {
		t.Fatalf("Process: %s, delivery got %v", s.Action, actions(f))
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	f = newFake(2, "block")
	if s := w.Process(ctx, f); s.Action != sdk.ActionRelease || first(f).Action != sdk.ActionRelease {
		t.Fatalf("Process cut short: %s, delivery got %v (cause %v)", s.Action, actions(f), s.Cause)
	}
}
