package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// slowReceiver makes every Receive a slow round trip (an SQS long poll that
// returns little) and records how many run at once.
type slowReceiver struct {
	sdk.Broker
	now, peak atomic.Int64
}

func (s *slowReceiver) Receive(ctx context.Context, q string, max int) ([]sdk.Delivery, error) {
	n := s.now.Add(1)
	defer s.now.Add(-1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	select {
	case <-time.After(5 * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Broker.Receive(ctx, q, min(max, 2))
}

// filledMemory returns a memory broker with n messages (a multiple of 100)
// of type "t" on queue "q".
func filledMemory(t *testing.T, n int) *memory.Broker {
	t.Helper()
	br, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range n / 100 {
		batch := make([]*sdk.Message, 100)
		for i := range batch {
			batch[i] = &sdk.Message{Type: "t"}
		}
		if err := br.Publish(context.Background(), "q", batch...); err != nil {
			t.Fatal(err)
		}
	}
	return br
}

// handleAll runs a Worker with opts (queue "q", a no-op handler) on sub
// until it has handled n messages.
func handleAll(t *testing.T, sub sdk.Subscriber, n int64, opts sdk.WorkerOptions) {
	t.Helper()
	var handled atomic.Int64
	done := make(chan struct{})
	opts.Queue, opts.Logger = "q", slog.New(slog.NewTextHandler(io.Discard, nil))
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
		if handled.Add(1) == n {
			close(done)
		}
		return nil
	}), opts)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, w, done, func() string { return fmt.Sprintf("%d of %d handled", handled.Load(), n) })
}

// runUntil runs w until done is closed, then stops it; after 30 s it
// fails with what.
func runUntil(t *testing.T, w *sdk.Worker, done <-chan struct{}, what func() string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cancel()
		<-errc
		t.Fatal(what())
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestWorkerReceiveLoops(t *testing.T) {
	for _, loops := range []int{1, 4} {
		const n = 200
		br := filledMemory(t, n)
		sub := &slowReceiver{Broker: br}
		var mu sync.Mutex
		seen := map[string]int{}
		done := make(chan struct{})
		w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			seen[d.Message().ID]++
			if len(seen) == n {
				select {
				case <-done:
				default:
					close(done)
				}
			}
			return nil
		}), sdk.WorkerOptions{Queue: "q", Concurrency: 8, ReceiveLoops: loops, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		runUntil(t, w, done, func() string {
			mu.Lock()
			defer mu.Unlock()
			return fmt.Sprintf("loops %d: %d of %d handled", loops, len(seen), n)
		})
		for id, c := range seen {
			if c != 1 {
				t.Errorf("loops %d: message %s handled %d times", loops, id, c)
			}
		}
		if peak := sub.peak.Load(); (loops == 1) != (peak == 1) || peak > int64(loops) {
			t.Errorf("ReceiveLoops %d: at most %d Receive calls at once, want %d", loops, peak, loops)
		}
		_ = br.Close()
	}
	if _, err := sdk.NewWorker(&slowReceiver{}, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "q", ReceiveLoops: -1}); err == nil {
		t.Error("NewWorker accepted ReceiveLoops -1")
	}
}

// batchReceiver is a ReceiveBatcher whose Receive returns at most 10, after
// a round trip; it records what each call asked for and how many ran at once.
type batchReceiver struct {
	slowReceiver
	mu          sync.Mutex
	asks        []int // max of every Receive
	overAsks    int   // Receives that asked for more than 10
	calls, msgs atomic.Int64
}

func (b *batchReceiver) ReceiveBatch() int { return 10 }

func (b *batchReceiver) Receive(ctx context.Context, q string, max int) ([]sdk.Delivery, error) {
	n := b.now.Add(1)
	defer b.now.Add(-1)
	for p := b.peak.Load(); n > p && !b.peak.CompareAndSwap(p, n); p = b.peak.Load() {
	}
	b.mu.Lock()
	b.asks = append(b.asks, max)
	if max > 10 {
		b.overAsks++
	}
	b.mu.Unlock()
	select {
	case <-time.After(5 * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	ds, err := b.Broker.Receive(ctx, q, min(max, 10))
	if len(ds) > 0 {
		b.calls.Add(1)
		b.msgs.Add(int64(len(ds)))
	}
	return ds, err
}

// TestWorkerReceiveLoopsBatcher: on a ReceiveBatcher (SQS: 10 a call) the
// loops of a Worker share the free slots, a batch each, so that their calls
// are in flight together and full: before, one loop took every free slot
// for a Receive that could return only 10, and the others waited.
func TestWorkerReceiveLoopsBatcher(t *testing.T) {
	const n = 2000
	br := filledMemory(t, n)
	defer br.Close()
	sub := &batchReceiver{slowReceiver: slowReceiver{Broker: br}}
	handleAll(t, sub, n, sdk.WorkerOptions{Concurrency: 32, Prefetch: 32, ReceiveLoops: 4})
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.overAsks > 0 {
		t.Errorf("%d of %d Receive calls asked for more than the broker's batch of 10", sub.overAsks, len(sub.asks))
	}
	if p := sub.peak.Load(); p != 4 {
		t.Errorf("at most %d Receive calls at once, want the 4 loops'", p)
	}
	mean := float64(sub.msgs.Load()) / float64(sub.calls.Load())
	t.Logf("%d Receive calls returned %d messages: %.2f a call; peak %d at once", sub.calls.Load(), sub.msgs.Load(), mean, sub.peak.Load())
	if mean < 9 {
		t.Errorf("%.2f messages per Receive that returned any, want at least 9 of 10: calls not full", mean)
	}
}

// TestWorkerReceiveLoopsDefaultOnBatcher: with ReceiveLoops unset, a Worker
// on a ReceiveBatcher runs as many loops as fill its slots in one round of
// calls (at most MaxDefaultReceiveLoops); elsewhere one.
func TestWorkerReceiveLoopsDefaultOnBatcher(t *testing.T) {
	for _, c := range []struct {
		concurrency int
		batcher     bool
		want        int64
	}{
		{concurrency: 32, batcher: true, want: sdk.MaxDefaultReceiveLoops}, // 64 slots
		{concurrency: 8, batcher: true, want: 2},                           // 16 slots
		{concurrency: 4, batcher: true, want: 1},                           // 8 slots
		{concurrency: 32, batcher: false, want: 1},
	} {
		const n = 1000
		br := filledMemory(t, n)
		var sub sdk.Subscriber
		var peak *atomic.Int64
		if c.batcher {
			b := &batchReceiver{slowReceiver: slowReceiver{Broker: br}}
			sub, peak = b, &b.peak
		} else {
			slow := &slowReceiver{Broker: br}
			sub, peak = slow, &slow.peak
		}
		handleAll(t, sub, n, sdk.WorkerOptions{Concurrency: c.concurrency})
		if p := peak.Load(); p != c.want {
			t.Errorf("Concurrency %d, ReceiveBatcher %v: at most %d Receive calls at once, want %d", c.concurrency, c.batcher, p, c.want)
		}
		_ = br.Close()
	}
}

// TestWorkerReceiveLoopsShareSlots: the loops of a Worker on a
// ReceiveBatcher split the slots between them, so that their calls are in
// flight together even when no slot comes back. With 16 slots (Concurrency
// 8) and batches of 10, a loop used to take 10 and leave the other loop 6,
// short of the batch it waits for: with handlers that do not return, the
// second call never started.
func TestWorkerReceiveLoopsShareSlots(t *testing.T) {
	br := filledMemory(t, 100)
	defer br.Close()
	sub := &batchReceiver{slowReceiver: slowReceiver{Broker: br}}
	release := make(chan struct{})
	stop := runWorker(t, sub, sdk.HandlerFunc(func(ctx context.Context, _ sdk.Delivery) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}), sdk.WorkerOptions{Concurrency: 8, HeartbeatInterval: -1})
	defer func() { // before br.Close
		close(release)
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for sub.peak.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if p := sub.peak.Load(); p != 2 {
		sub.mu.Lock()
		asks := append([]int(nil), sub.asks...)
		sub.mu.Unlock()
		t.Fatalf("at most %d Receive calls at once in 5s (asks %v), want the 2 loops' together", p, asks)
	}
}

// stopsForGoodSub is a ReceiveBatcher of 1 on which the first Receive waits
// (a long poll on an idle queue, which may never return) and the next one,
// made once the first is in flight, finds the queue gone.
type stopsForGoodSub struct {
	calls    atomic.Int32
	inFlight chan struct{}
}

func (s *stopsForGoodSub) ReceiveBatch() int { return 1 }

func (s *stopsForGoodSub) Receive(ctx context.Context, q string, max int) ([]sdk.Delivery, error) {
	if s.calls.Add(1) == 1 {
		close(s.inFlight)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	<-s.inFlight
	return nil, fmt.Errorf("queue %q: %w", q, sdk.ErrNotFound)
}

// TestWorkerReceiveLoopsOneStopsThemAll: with several receive loops on one
// queue, a loop whose Receive finds the queue missing stops the Worker: Run
// returns ErrNotFound at once, and the other loop's Receive waiting on the
// queue is cancelled rather than left to wait until Run's ctx ends (it was:
// Run stayed running, and live, with its queue gone).
func TestWorkerReceiveLoopsOneStopsThemAll(t *testing.T) {
	sub := &stopsForGoodSub{inFlight: make(chan struct{})}
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "q", Concurrency: 2, Prefetch: 2, ReceiveLoops: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx) }()
	select {
	case err := <-errc:
		if !errors.Is(err, sdk.ErrNotFound) {
			t.Fatalf("Run returned %v, want ErrNotFound", err)
		}
	case <-time.After(berthtest.WaitTimeout):
		h := w.Health()
		cancel()
		<-errc
		t.Fatalf("Run still running %s after one receive loop found the queue missing (health then: state %s, live %v)", berthtest.WaitTimeout, h.State, h.Live)
	}
}
