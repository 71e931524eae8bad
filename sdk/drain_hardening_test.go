package sdk_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// Process with a context already ended: the handler starts cancelled with
// ErrShutdown and the delivery is released, as the doc says. The check must
// not depend on context.AfterFunc's goroutine winning the race with a quick
// handler.
func TestProcessWithEndedContextReleases(t *testing.T) {
	var causes atomic.Int32
	w, err := sdk.NewWorker(newFakeSub(), sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if errors.Is(context.Cause(ctx), sdk.ErrShutdown) {
			causes.Add(1)
		}
		return ctx.Err() // honours its context: nil only when it is live
	}), sdk.WorkerOptions{Queue: "q", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	const runs = 200
	for i := range runs {
		if s := w.Process(ctx, newFake(1, "t")); s.Action != sdk.ActionRelease {
			t.Fatalf("run %d: ctx ended before Process, settlement %s, want release", i, s.Action)
		}
	}
	if n := causes.Load(); n != runs {
		t.Errorf("%d of %d handlers saw cause ErrShutdown", n, runs)
	}
}

// A Run that ended with ErrDrainTimeout leaves a goroutine behind with the
// handler that ignored its context, and a delivery received but not started.
// A second Run (a supervisor's restart) must not make that goroutine run the
// waiting delivery once the handler returns: its Run's drain deadline passed,
// so it is handed back (SQS-like: Retry, not run), as without the restart.
func TestRestartAfterDrainTimeoutKeepsItsDeadline(t *testing.T) {
	sub := newFakeSub()
	gate := make(chan struct{})
	started := make(chan struct{}, 1)
	var ranLate atomic.Bool
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Message().Type == "stuck" {
			started <- struct{}{}
			<-gate // ignores its context
			return nil
		}
		ranLate.Store(true)
		return nil
	})
	w, err := sdk.NewWorker(sub, h, sdk.WorkerOptions{Queue: "q", Concurrency: 1, Prefetch: 1,
		DrainTimeout: 20 * time.Millisecond, SettleTimeout: 20 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() { done1 <- w.Run(ctx1) }()
	stuck, waiting := newFake(1, "stuck"), newFake(1, "b")
	sub.ch <- stuck.WithoutRelease()
	<-started
	sub.ch <- waiting.WithoutRelease()
	for w.Health().Held != 2 {
		time.Sleep(time.Millisecond)
	}
	cancel1()
	if err := <-done1; !errors.Is(err, sdk.ErrDrainTimeout) {
		t.Fatalf("Run 1: %v, want ErrDrainTimeout", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- w.Run(ctx2) }()
	for w.Health().State != sdk.StateRunning {
		time.Sleep(time.Millisecond)
	}
	close(gate) // the abandoned handler returns at last
	waiting.Wait(t)
	stuck.Wait(t)
	cancel2()
	if err := <-done2; err != nil {
		t.Fatalf("Run 2: %v", err)
	}
	if ranLate.Load() {
		t.Errorf("a delivery not started before Run 1's drain deadline ran after Run 1 returned; settlements %v", actions(waiting))
	}
}

// An extension under way when Run stops its heartbeat is cancelled, not
// waited for to its own deadline: a broker that hangs must not stretch
// shutdown past its documented bound.
func TestStoppedHeartbeatCancelsHungExtension(t *testing.T) {
	sub := newFakeSub()
	gate := make(chan struct{})
	started := make(chan struct{}, 1)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		started <- struct{}{}
		<-gate
		return nil
	})
	attempt := make(chan struct{}, 100)
	ended := make(chan error, 100)
	f := newFake(1, "job", berthtest.OnExtend(func(ctx context.Context, _ time.Duration) error {
		attempt <- struct{}{}
		<-ctx.Done() // a black-holed connection
		ended <- ctx.Err()
		return ctx.Err()
	}))
	// SettleTimeout bounds each extension: 10s, far beyond the test.
	w, err := sdk.NewWorker(sub, h, sdk.WorkerOptions{Queue: "q", Concurrency: 1, Prefetch: 1, Lease: time.Minute,
		HeartbeatInterval: 20 * time.Millisecond, SettleTimeout: 10 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	sub.ch <- f
	<-started
	<-attempt // an extension is under way, and hangs
	cancel()
	close(gate) // the handler returns: the drain is over at once
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	f.Wait(t)
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the hung extension ended with %v, want it cancelled when the heartbeat stopped", err)
		}
	default:
		t.Error("Run returned while an extension was still under way")
	}
}

// Decode accepts one JSON value and nothing after it but white space: a
// stray '}' or ']' (which json.Decoder.More does not report) is refused as
// trailing data, permanently, like any other.
func TestDecodeRefusesTrailingData(t *testing.T) {
	type args struct{ A int }
	for body, ok := range map[string]bool{
		`{"A":1}`: true, "{\"A\":1}\n\t ": true,
		`{"A":1}x`: false, `{"A":1}}`: false, `{"A":1} ]]]`: false, `{"A":1}{"A":2}`: false, `{"A":1} 2`: false,
	} {
		_, err := sdk.Decode[args](&sdk.Message{ID: "m", Type: "t", Body: []byte(body)})
		if ok != (err == nil) {
			t.Errorf("Decode(%q) = %v", body, err)
		}
		if err != nil && sdk.Classify(err) != sdk.ClassPermanent {
			t.Errorf("Decode(%q): class %s, want permanent", body, sdk.Classify(err))
		}
	}
}
