package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// waitHealth polls w.Health until ok accepts it, failing the test after 10s
// with the last snapshot.
func waitHealth(t *testing.T, w *sdk.Worker, what string, ok func(sdk.Health) bool) sdk.Health {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h := w.Health()
		if ok(h) {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("health never became %s; last: %+v", what, h)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHealthLifecycle follows a Worker on the memory broker from idle to
// stopped: live and ready while it runs, held deliveries counted, not ready
// while draining, not live once Run returned, and the broker's error kept.
func TestHealthLifecycle(t *testing.T) {
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	started, finish := make(chan struct{}, 4), make(chan struct{})
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		started <- struct{}{}
		<-finish
		return nil
	})
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: "health", Concurrency: 2, Prefetch: 1, Logger: quiet, DrainTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	got := w.Health()
	if got.State != sdk.StateIdle || !got.Live || got.Ready || got.Receiving || got.Queue != "health" || got.Capacity != 3 {
		t.Fatalf("before Run: %+v, want idle, live, not ready, capacity 3", got)
	}

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	waitHealth(t, w, "running and ready", func(h sdk.Health) bool {
		return h.State == sdk.StateRunning && h.Live && h.Ready && h.Receiving && h.Reason == ""
	})

	if err := b.Publish(ctx, "health", &sdk.Message{Type: "a"}, &sdk.Message{Type: "b"}); err != nil {
		t.Fatal(err)
	}
	<-started
	<-started
	got = waitHealth(t, w, "holding two deliveries", func(h sdk.Health) bool { return h.Held == 2 })
	if got.LastReceive.IsZero() || !got.Ready || got.ReceiveFailures != 0 {
		t.Errorf("while handling: %+v, want a last receive, ready, no failures", got)
	}

	cancel() // drain: the two handlers still run
	got = waitHealth(t, w, "draining", func(h sdk.Health) bool { return h.State == sdk.StateDraining })
	if got.Ready || !got.Live || got.Receiving || got.Held != 2 || !strings.Contains(got.Reason, "draining") {
		t.Errorf("draining: %+v, want live, not ready, not receiving, 2 held", got)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	got = w.Health()
	if got.State != sdk.StateStopped || got.Live || got.Ready || got.Held != 0 || got.RunError != "" {
		t.Errorf("after Run: %+v, want stopped, not live, not ready, nothing held", got)
	}

	// Run again on a closed broker: Run returns ErrClosed, which Health keeps.
	b.Close()
	if err := w.Run(ctx); !errors.Is(err, sdk.ErrClosed) {
		t.Fatalf("Run on a closed broker = %v", err)
	}
	got = w.Health()
	if got.Live || got.State != sdk.StateStopped || got.RunError == "" || !strings.Contains(got.Reason, got.RunError) {
		t.Errorf("after ErrClosed: %+v, want not live with the run error as reason", got)
	}
}

// downSub fails every Receive while down is set, as a broker that refuses
// connections does, and otherwise hands out fakeSub's deliveries. The
// memory broker cannot fail a Receive and come back, so the Worker's
// failure path is driven here.
type downSub struct {
	*fakeSub
	down  atomic.Bool
	calls atomic.Int64
}

func (s *downSub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	s.calls.Add(1)
	if s.down.Load() {
		return nil, errors.New("dial tcp 127.0.0.1:5672: connect: connection refused \xff")
	}
	return s.fakeSub.Receive(ctx, queue, max)
}

// TestHealthReceiveFailures checks that a failing Receive makes the Worker
// not ready, with the error as evidence (sanitised), while it stays live,
// and that the first Receive that succeeds makes it ready again.
func TestHealthReceiveFailures(t *testing.T) {
	sub := &downSub{fakeSub: newFakeSub()}
	sub.down.Store(true)
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "q", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	got := waitHealth(t, w, "failing", func(h sdk.Health) bool { return h.ReceiveFailures >= 2 })
	if got.Ready || !got.Live || got.State != sdk.StateRunning {
		t.Errorf("receive failing: %+v, want live and not ready", got)
	}
	if !strings.Contains(got.Reason, "connection refused") || got.LastReceiveErrorAt.IsZero() {
		t.Errorf("reason %q / at %v: want the receive error as evidence", got.Reason, got.LastReceiveErrorAt)
	}
	if !utf8.ValidString(got.LastReceiveError) {
		t.Errorf("LastReceiveError %q is not valid UTF-8", got.LastReceiveError)
	}

	sub.down.Store(false)
	f := newFake(1, "job")
	sub.ch <- f
	waitSettled(t, f)
	got = waitHealth(t, w, "ready again", func(h sdk.Health) bool { return h.Ready })
	if got.ReceiveFailures != 0 || got.LastReceive.Before(got.LastReceiveErrorAt) || got.LastReceiveError == "" {
		t.Errorf("recovered: %+v, want no failures, a receive after the error, the error kept", got)
	}
}

// A Worker's Health says whether it is live (Run has not returned) and
// ready (running, and receiving without errors), with the evidence.
func ExampleWorker_Health() {
	broker, _ := memory.New(memory.Options{})
	defer broker.Close()
	w, _ := sdk.NewWorker(broker, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "billing", Concurrency: 4})
	h := w.Health()
	fmt.Println(h.Queue, h.State, "live:", h.Live, "ready:", h.Ready, "capacity:", h.Capacity) // Concurrency + Prefetch (default: Concurrency)

	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- w.Run(ctx) }()
	for !w.Health().Ready {
		time.Sleep(time.Millisecond)
	}
	fmt.Println(w.Health().State, "ready:", w.Health().Ready)
	stop()
	<-ran
	h = w.Health()
	fmt.Println(h.State, "live:", h.Live, "ready:", h.Ready)
	// Output:
	// billing idle live: true ready: false capacity: 8
	// running ready: true
	// stopped live: false ready: false
}

// connSub is a subscriber whose broker reports its connection, as
// RabbitMQ's does: Receive waits through the outage instead of failing.
type connSub struct {
	*fakeSub
	err atomic.Pointer[error]
}

func (s *connSub) ConnectionError() error {
	if p := s.err.Load(); p != nil {
		return *p
	}
	return nil
}

// TestHealthConnectionReporter: a broker that reports its connection down
// makes the Worker not ready, with the reason, though no Receive failed.
func TestHealthConnectionReporter(t *testing.T) {
	sub := &connSub{fakeSub: newFakeSub()}
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "q", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitHealth(t, w, "ready", func(h sdk.Health) bool { return h.Ready })

	down := fmt.Errorf("%w: connection reset", sdk.ErrUnavailable)
	sub.err.Store(&down)
	got := w.Health()
	if got.Ready || !got.Live || got.ReceiveFailures != 0 || !strings.Contains(got.Reason, "connection reset") {
		t.Errorf("connection down: %+v, want live, not ready, the connection error as reason", got)
	}
	sub.err.Store(nil)
	if got := w.Health(); !got.Ready {
		t.Errorf("connection back: %+v, want ready", got)
	}
}
