package sdk_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// leaseCounter is an Observer and LeaseObserver that counts the successful
// lease extensions and keeps the settlements.
type leaseCounter struct {
	mu       sync.Mutex
	extended int
	changed  chan struct{} // a value after each event
	settled  []sdk.Settlement
}

func (c *leaseCounter) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (c *leaseCounter) Settled(_ context.Context, _ sdk.Delivery, s sdk.Settlement) {
	c.mu.Lock()
	c.settled = append(c.settled, s)
	c.mu.Unlock()
	c.poke()
}

func (c *leaseCounter) LeaseExtended(_ context.Context, _ sdk.Delivery, _ time.Duration, err error) {
	if err == nil {
		c.mu.Lock()
		c.extended++
		c.mu.Unlock()
	}
	c.poke()
}

func (c *leaseCounter) poke() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (c *leaseCounter) extensions() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.extended
}

// TestShutdownCancelledHandlerKeepsLeasePastTimeout: a handler cancelled at
// the drain deadline (cause ErrShutdown) that is still running when its job
// timeout comes has not timed out — its context's cause is ErrShutdown, and
// it is settled by a release. The heartbeat must go on extending its lease
// until it returns within the drain's grace. Before, the watchdog marked it
// timed out even though its cancel lost to the shutdown's, the heartbeat
// stopped extending, the lease ran out, the release was refused
// (ErrLeaseLost) and the job came back with an attempt counted.
func TestShutdownCancelledHandlerKeepsLeasePastTimeout(t *testing.T) {
	const lease = 400 * time.Millisecond
	b := newMemory(t, memory.Options{Lease: lease})
	publish(t, b, "hwork-shutdown-timeout", &sdk.Message{Type: "job"})
	started := make(chan context.Context, 1)
	finish := make(chan struct{})
	h := sdk.HandlerFunc(func(ctx context.Context, _ sdk.Delivery) error {
		started <- ctx
		<-finish // ignores its context for a while, within the drain's grace
		return ctx.Err()
	})
	obs := &leaseCounter{changed: make(chan struct{}, 1)}
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{
		Queue: "hwork-shutdown-timeout", Concurrency: 1, Prefetch: 1,
		Timeout: 300 * time.Millisecond, HeartbeatInterval: lease / 4,
		DrainTimeout: 10 * time.Millisecond, SettleTimeout: 5 * time.Second,
		Observers: []sdk.Observer{obs},
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(ctx) }()
	hctx := <-started
	cancel()
	<-hctx.Done()
	if c := context.Cause(hctx); !errors.Is(c, sdk.ErrShutdown) {
		t.Fatalf("handler context cause %v; want ErrShutdown", c)
	}
	// Past the job timeout (300ms) and the lease (400ms) the heartbeat
	// still extends the lease: wait for extensions covering three leases.
	from := obs.extensions()
	bound := time.NewTimer(4 * time.Second)
	defer bound.Stop()
	for obs.extensions()-from < 12 {
		select {
		case <-obs.changed:
		case <-bound.C:
			t.Errorf("lease extended %d times in 4s after the shutdown cancel; the heartbeat stopped", obs.extensions()-from)
			goto out
		}
	}
out:
	// Let the broker notice an expired lease, if any.
	if _, err := b.Stats(context.Background(), "hwork-shutdown-timeout"); err != nil {
		t.Fatal(err)
	}
	close(finish)
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.settled) != 1 {
		t.Fatalf("%d settlements; want 1", len(obs.settled))
	}
	if s := obs.settled[0]; s.Action != sdk.ActionRelease || s.Err != nil {
		t.Errorf("settled %s (err %v); want %s without error", s.Action, s.Err, sdk.ActionRelease)
	}
}

// TestObserverGoexitInSettledStillTellsTheOthers: an observer whose Settled
// calls runtime.Goexit (t.FailNow in a test observer) ends the Worker's
// goroutine, which is replaced; the observers after it must still see the
// settlement, as after a panic in Settled: each of them saw the delivery
// start, and one that counts deliveries in flight or ends a span in Settled
// (telemetry) otherwise kept it in flight for ever. Checked on the handler
// goroutine (a retry), on the background-ack goroutine (AsyncAcker) and in
// the settlement of a handler that itself called Goexit.
func TestObserverGoexitInSettledStillTellsTheOthers(t *testing.T) {
	for _, kind := range []string{"sync", "async", "handler-goexit"} {
		t.Run(kind, func(t *testing.T) {
			sub := newFakeSub()
			exiter := observer{settled: func(context.Context, sdk.Delivery, sdk.Settlement) { runtime.Goexit() }}
			rec := berthtest.NewRecorder()
			rec.SetWaitTimeout(5 * time.Second)
			h := sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
				switch kind {
				case "sync":
					return errors.New("transient")
				case "handler-goexit":
					runtime.Goexit()
				}
				return nil
			})
			stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Prefetch: 1,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observers: []sdk.Observer{exiter, rec}})
			acks := make(chan func(error), 4)
			for range 2 {
				var d sdk.Delivery = newFake(1, "t")
				if kind == "async" {
					d = &asyncDelivery{Delivery: d.(*berthtest.Delivery), acks: acks}
				}
				sub.ch <- d
				if kind == "async" {
					select {
					case done := <-acks:
						done(nil)
					case <-time.After(berthtest.WaitTimeout):
						t.Fatal("job not run")
					}
				}
			}
			rec.Wait(t, 2)
			if err := stop(); err != nil {
				t.Fatalf("Run returned %v", err)
			}
		})
	}
}

// goexitLease is a LeaseObserver whose LeaseExtended calls runtime.Goexit.
type goexitLease struct{ observer }

func (goexitLease) LeaseExtended(context.Context, sdk.Delivery, time.Duration, error) {
	runtime.Goexit()
}

// TestLeaseObserverGoexitStillLosesLease: a LeaseObserver that calls
// runtime.Goexit in LeaseExtended ends the extension's goroutine; the
// heartbeat must still act on the extension's outcome, as after a panic
// there ("the heartbeat acts on err regardless"): a refused extension
// (ErrLeaseLost) cancels the handler's context with cause ErrLeaseLost and
// the delivery is not settled. Before, the Goexit came before that: the
// handler ran on without its lease and its settlement was attempted.
func TestLeaseObserverGoexitStillLosesLease(t *testing.T) {
	sub := newFakeSub()
	cause := make(chan error, 1)
	h := sdk.HandlerFunc(func(ctx context.Context, _ sdk.Delivery) error {
		select {
		case <-ctx.Done():
			cause <- context.Cause(ctx)
		case <-time.After(5 * time.Second):
			cause <- errors.New("handler context not cancelled in 5s")
		}
		return ctx.Err()
	})
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Lease: 30 * time.Millisecond, HeartbeatInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observers: []sdk.Observer{goexitLease{}}})
	f := newFake(1, "long", berthtest.OnExtend(func(context.Context, time.Duration) error { return sdk.ErrLeaseLost }))
	sub.ch <- f
	if c := <-cause; !errors.Is(c, sdk.ErrLeaseLost) {
		t.Errorf("handler context cause %v; want ErrLeaseLost", c)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if a := actions(f); len(a) != 0 {
		t.Errorf("delivery whose lease was lost settled %v; want no settlement", a)
	}
}
