package memory_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// publishAsync starts Publish of msgs to queue and returns its result's
// channel.
func publishAsync(ctx context.Context, b *memory.Broker, queue string, msgs ...*sdk.Message) <-chan error {
	res := make(chan error, 1)
	go func() { res <- b.Publish(ctx, queue, msgs...) }()
	return res
}

// awaitWaiting fails t unless a Publish to queue is soon waiting for room.
func awaitWaiting(t *testing.T, b *memory.Broker, queue string, res <-chan error) {
	t.Helper()
	awaitWaiters(t, b, queue, 1, res)
}

// awaitWaiters fails t unless n Publish calls to queue are soon waiting for
// room and the one whose result res carries has not returned.
func awaitWaiters(t *testing.T, b *memory.Broker, queue string, n int, res <-chan error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for memory.PublishesWaiting(b, queue) < n {
		select {
		case err := <-res:
			t.Fatalf("Publish returned %v instead of waiting for room", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Publish calls never waited for room", n)
		}
		time.Sleep(time.Millisecond)
	}
}

// backlogOf returns queue's ready and delayed counts.
func backlogOf(t *testing.T, b *memory.Broker, queue string) (ready, delayed, inFlight int64) {
	t.Helper()
	s, err := b.Stats(ctxT(t), queue)
	if err != nil {
		t.Fatal(err)
	}
	return s.Ready, s.Delayed, s.InFlight
}

func msgs(n int) []*sdk.Message {
	ms := make([]*sdk.Message, n)
	for i := range ms {
		ms[i] = &sdk.Message{Type: "t", Body: fmt.Appendf(nil, "%d", i)}
	}
	return ms
}

func TestMaxBacklogHoldsPublishBack(t *testing.T) {
	b := newBroker(t, memory.Options{MaxBacklog: 4})
	ctx := ctxT(t)
	if err := b.Publish(ctx, "q", msgs(3)...); err != nil {
		t.Fatal(err)
	}
	waiting := msgs(2)
	res := publishAsync(ctx, b, "q", waiting...)
	awaitWaiting(t, b, "q", res) // 3 + 2 > 4
	if r, _, _ := backlogOf(t, b, "q"); r != 3 {
		t.Fatalf("ready %d while the Publish of 2 waits, want 3: it stored part of its batch", r)
	}
	receiveOne(t, b, "q") // 2 left: the batch fits
	if err := <-res; err != nil {
		t.Fatalf("Publish after room was made: %v", err)
	}
	if r, _, f := backlogOf(t, b, "q"); r != 4 || f != 1 {
		t.Fatalf("ready %d, in flight %d; want 4 and 1", r, f)
	}
	// The waiting batch went in after what was there, in its order.
	ds, err := b.Receive(ctx, "q", 4)
	if err != nil || len(ds) != 4 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	if ds[2].Message().ID != waiting[0].ID || ds[3].Message().ID != waiting[1].ID {
		t.Errorf("the waiting batch was not stored last, in order")
	}
}

func TestMaxBacklogBatchLargerThanTheBound(t *testing.T) {
	b := newBroker(t, memory.Options{MaxBacklog: 2})
	ctx := ctxT(t)
	// On an empty queue a batch over the bound goes in whole.
	if err := b.Publish(ctx, "q", msgs(3)...); err != nil {
		t.Fatal(err)
	}
	res := publishAsync(ctx, b, "q", msgs(3)...)
	awaitWaiting(t, b, "q", res)
	if _, err := b.Receive(ctx, "q", 2); err != nil {
		t.Fatal(err)
	}
	// One is left: the batch of 3 waits for an empty queue.
	if !memory.PublishWaiting(b, "q") {
		t.Fatal("the Publish of 3 stopped waiting with one message left")
	}
	select {
	case err := <-res:
		t.Fatalf("Publish of 3 returned %v with one message left", err)
	default:
	}
	receiveOne(t, b, "q")
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if r, _, _ := backlogOf(t, b, "q"); r != 3 {
		t.Fatalf("ready %d, want the whole batch of 3", r)
	}
}

func TestMaxBacklogPublishCancelledStoresNothing(t *testing.T) {
	b := newBroker(t, memory.Options{MaxBacklog: 1})
	if err := b.Publish(ctxT(t), "q", msgs(1)...); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	res := publishAsync(ctx, b, "q", msgs(1)...)
	awaitWaiting(t, b, "q", res)
	cancel()
	err := <-res
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "MaxBacklog 1") {
		t.Fatalf("cancelled waiting Publish = %v, want context.Canceled naming the bound", err)
	}
	if r, _, _ := backlogOf(t, b, "q"); r != 1 {
		t.Fatalf("ready %d after a cancelled Publish, want 1", r)
	}
	// The queue still works: room is made, a Publish goes through.
	receiveOne(t, b, "q")
	if err := b.Publish(ctxT(t), "q", msgs(1)...); err != nil {
		t.Fatal(err)
	}
}

// A waiting Publish whose context has ended when room is made stores
// nothing.
func TestMaxBacklogPublishCancelledAsRoomIsMade(t *testing.T) {
	for i := range 20 {
		b := newBroker(t, memory.Options{MaxBacklog: 1})
		if err := b.Publish(ctxT(t), "q", msgs(1)...); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(ctxT(t))
		res := publishAsync(ctx, b, "q", msgs(1)...)
		awaitWaiting(t, b, "q", res)
		memory.MakeRoom(b, "q", cancel)
		if err := <-res; !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: Publish whose context ended as room was made = %v, want context.Canceled", i, err)
		}
		if r, _, _ := backlogOf(t, b, "q"); r != 0 {
			t.Fatalf("round %d: ready %d after a cancelled Publish, want 0: it stored its batch", i, r)
		}
	}
}

// A waiting batch is not overtaken by a smaller Publish made after it,
// which would fit sooner: under a stream of those it would wait for ever.
func TestMaxBacklogWaitingBatchNotOvertaken(t *testing.T) {
	b := newBroker(t, memory.Options{MaxBacklog: 2})
	ctx := ctxT(t)
	if err := b.Publish(ctx, "q", msgs(2)...); err != nil {
		t.Fatal(err)
	}
	batch := msgs(2)
	res := publishAsync(ctx, b, "q", batch...)
	awaitWaiting(t, b, "q", res)
	receiveOne(t, b, "q") // one left: the batch of 2 does not fit yet
	single := msgs(1)
	later := publishAsync(ctx, b, "q", single...)
	awaitWaiters(t, b, "q", 2, later) // the Publish of 1 waits behind the batch, though it fits
	receiveOne(t, b, "q")             // empty: the batch goes in, the single waits
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "q", 2)
	if err != nil || len(ds) != 2 || ds[0].Message().ID != batch[0].ID || ds[1].Message().ID != batch[1].ID {
		t.Fatalf("Receive after the batch went in: %d, %v; want the batch", len(ds), err)
	}
	if err := <-later; err != nil {
		t.Fatal(err)
	}
	if d := receiveOne(t, b, "q"); d.Message().ID != single[0].ID {
		t.Fatal("the single message did not follow the batch")
	}
}

func TestMaxBacklogCloseEndsWaitingPublish(t *testing.T) {
	b := newBroker(t, memory.Options{MaxBacklog: 1})
	if err := b.Publish(ctxT(t), "q", msgs(1)...); err != nil {
		t.Fatal(err)
	}
	res := publishAsync(ctxT(t), b, "q", msgs(1)...)
	awaitWaiting(t, b, "q", res)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-res; !errors.Is(err, sdk.ErrClosed) {
		t.Fatalf("waiting Publish after Close = %v, want ErrClosed", err)
	}
}

// Delayed messages count toward the bound, leased ones do not, and a message
// coming back (Retry) never waits, even past the bound.
func TestMaxBacklogCountsDelayedNotLeased(t *testing.T) {
	b := newBroker(t, memory.Options{MaxBacklog: 2})
	ctx := ctxT(t)
	if err := b.Publish(ctx, "q", &sdk.Message{Delay: time.Hour}, &sdk.Message{}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	res := publishAsync(wctx, b, "q", msgs(1)...)
	awaitWaiting(t, b, "q", res) // one ready and one delayed fill the bound
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish into a backlog full of a ready and a delayed message = %v", err)
	}
	d := receiveOne(t, b, "q") // leased: no longer counted
	if err := b.Publish(ctx, "q", msgs(1)...); err != nil {
		t.Fatal(err)
	}
	if err := d.Retry(ctx, 0, errors.New("again")); err != nil {
		t.Fatalf("Retry into a full backlog: %v", err)
	}
	if r, dl, f := backlogOf(t, b, "q"); r != 2 || dl != 1 || f != 0 {
		t.Fatalf("ready %d, delayed %d, in flight %d; want 2, 1, 0 (the retry past the bound)", r, dl, f)
	}
}

// Producers faster than a Worker never take the backlog past the bound, and
// every message is handled once.
func TestMaxBacklogWithWorker(t *testing.T) {
	const bound, producers, each, batch = 64, 4, 2500, 10
	b := newBroker(t, memory.Options{MaxBacklog: bound})
	ctx := ctxT(t)
	var mu sync.Mutex
	seen := map[string]int{}
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		mu.Lock()
		seen[d.Message().ID]++
		mu.Unlock()
		return nil
	}), sdk.WorkerOptions{Queue: "q", Concurrency: 8, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() { werr <- w.Run(wctx) }()

	var peak atomic.Int64
	sampling, stopSampling := context.WithCancel(ctx)
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for sampling.Err() == nil {
			if s, err := b.Stats(ctx, "q"); err == nil && s.Ready+s.Delayed > peak.Load() {
				peak.Store(s.Ready + s.Delayed)
			}
		}
	})
	var ids sync.Map
	var wg sync.WaitGroup
	for range producers {
		wg.Go(func() {
			for i := 0; i < each; i += batch {
				ms := msgs(batch)
				if err := b.Publish(ctx, "q", ms...); err != nil {
					t.Error(err)
					return
				}
				for _, m := range ms {
					ids.Store(m.ID, true)
				}
			}
		})
	}
	wg.Wait()
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == producers*each || ctx.Err() != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopSampling()
	sampler.Wait()
	stop()
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != producers*each {
		t.Fatalf("handled %d distinct messages, want %d", len(seen), producers*each)
	}
	ids.Range(func(k, _ any) bool {
		if n := seen[k.(string)]; n != 1 {
			t.Errorf("message %s handled %d times", k, n)
		}
		return true
	})
	if p := peak.Load(); p > bound || p == 0 {
		t.Errorf("backlog peaked at %d, bound %d", p, bound)
	}
}
