package sdk_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestShutdownSettlementNamesTheCallMade: a handler interrupted by shutdown
// hands its delivery back; where the delivery is no Releaser (SQS) that is a
// Retry, which consumes an attempt, and the Settlement reported says so
// (ActionRetry), as it does for a RetryAfter there. ActionRelease means "no
// attempt consumed": telemetry and the ledger count it as such.
func TestShutdownSettlementNamesTheCallMade(t *testing.T) {
	var seen []sdk.Action
	ob := observer{settled: func(_ context.Context, _ sdk.Delivery, s sdk.Settlement) { seen = append(seen, s.Action) }}
	w, err := sdk.NewWorker(newFakeSub(), sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		return ctx.Err() // honours its context: interrupted
	}), sdk.WorkerOptions{Queue: "q", Logger: quiet, Observers: []sdk.Observer{ob}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, releaser := range []bool{true, false} {
		f := newFake(1, "job")
		var d sdk.Delivery = f
		if !releaser {
			d = f.WithoutRelease()
		}
		seen = seen[:0]
		s := w.Process(ctx, d)
		call := first(f).Action
		if s.Action != call || len(seen) != 1 || seen[0] != call {
			t.Errorf("releaser %v: delivery got %s, Process reported %s, observer saw %v", releaser, call, s.Action, seen)
		}
	}
}

// TestDrainTimeoutReleasesUnstartedWork: a delivery received but not started
// when the drain began is released without consuming an attempt, also when
// every handler goroutine is held past the drain deadline by a handler that
// ignores its context. Run returns ErrDrainTimeout and its heartbeat stops:
// left queued behind the hung handler, the delivery would wait out its
// lease and come back with an attempt counted.
func TestDrainTimeoutReleasesUnstartedWork(t *testing.T) {
	sub := newFakeSub()
	gate := make(chan struct{})
	defer close(gate)
	started := make(chan struct{}, 1)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Message().Type == "stuck" {
			started <- struct{}{}
			<-gate // ignores its context
		}
		return nil
	})
	w, err := sdk.NewWorker(sub, h, sdk.WorkerOptions{Queue: "q", Concurrency: 1, Prefetch: 1,
		DrainTimeout: 20 * time.Millisecond, SettleTimeout: 20 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stuck, waiting := newFake(1, "stuck"), newFake(1, "b")
	sub.ch <- stuck
	<-started
	sub.ch <- waiting
	for w.Health().Held != 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, sdk.ErrDrainTimeout) {
		t.Fatalf("Run: %v, want ErrDrainTimeout", err)
	}
	if a := actions(waiting); len(a) != 1 || a[0] != string(sdk.ActionRelease) {
		t.Errorf("delivery not started when Run returned: settlements %v, want [release]", a)
	}
}

// TestSettlementDelayBoundedByMaxDelay: MaxDelay bounds the delays given to
// Retry (and Release) on every broker, and brokers cut a longer one to it.
// The Worker gives no longer one, so that the Settlement it reports (and
// the next attempt telemetry and the ledger derive from it) is the delay
// the broker applies: a backoff without a cap (Max math.MaxInt64) or a
// RetryAfter of a day used to be reported as such.
func TestSettlementDelayBoundedByMaxDelay(t *testing.T) {
	for name, ret := range map[string]error{
		"backoff":     errors.New("flaky"),
		"retry-after": sdk.RetryAfter(errors.New("busy"), 24*time.Hour),
	} {
		w, err := sdk.NewWorker(newFakeSub(), sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return ret }),
			sdk.WorkerOptions{Queue: "q", Logger: quiet, Retry: sdk.RetryPolicy{Backoff: sdk.Backoff{Base: 24 * time.Hour, Max: math.MaxInt64}}})
		if err != nil {
			t.Fatal(err)
		}
		f := newFake(1, "job")
		s := w.Process(context.Background(), f)
		if s.Delay > sdk.MaxDelay || first(f).Delay > sdk.MaxDelay || s.Delay != first(f).Delay {
			t.Errorf("%s: settlement %s after %v, broker asked for %v; want both at most MaxDelay %v", name, s.Action, s.Delay, first(f).Delay, sdk.MaxDelay)
		}
	}
}
