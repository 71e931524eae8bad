package rabbitmq

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestRollingCloseKeepsAttempt (issue 15): Workers on their own brokers
// consume a queue that keeps receiving messages; again and again the
// oldest is stopped (its Run drains, then its broker is closed) and
// replaced. No handler fails, so every message must be handled exactly
// once, at Attempt() 1: a clean shutdown hands back what it holds without
// counting a delivery. Before, Close cancelled the consumer at once, and a
// delivery still on its way reached the channel after basic.cancel;
// RabbitMQ 3.10 returns such a delivery to the queue with x-delivery-count
// + 1 (rabbit_fifo_client), so it came back at attempt 2 (0–3 a minute
// under the chaos command's rolling SIGTERMs, RELIABILITY.md).
func TestRollingCloseKeepsAttempt(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	pub := newBroker(t, url, Options{Logger: quiet})
	if err := pub.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		published = map[string]bool{}
		handled   = map[string]int{}
		late      []int
	)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond)
		mu.Lock()
		handled[d.Message().ID]++
		if d.Attempt() != 1 {
			late = append(late, d.Attempt())
		}
		mu.Unlock()
		return nil
	})
	type worker struct {
		b    *Broker
		stop context.CancelFunc
		done chan error
	}
	start := func() *worker {
		b, err := New(ctx, url, Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: q, Concurrency: 2, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		wk := &worker{b: b, stop: stop, done: make(chan error, 1)}
		go func() { wk.done <- w.Run(rctx) }()
		return wk
	}
	stopWorker := func(wk *worker) {
		wk.stop()
		if err := <-wk.done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
		if err := wk.b.Close(); err != nil {
			t.Error(err)
		}
	}

	pubStop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // a message every 4 ms: the workers keep up, with credit free
		for {
			select {
			case <-pubStop:
				return
			case <-time.After(4 * time.Millisecond):
			}
			m := &sdk.Message{Type: "rolling"}
			if err := pub.Publish(ctx, q, m); err != nil {
				t.Errorf("Publish: %v", err)
				return
			}
			mu.Lock()
			published[m.ID] = true
			mu.Unlock()
		}
	})
	ws := []*worker{start(), start(), start()}
	const rolls = 24
	for range rolls {
		time.Sleep(time.Duration(100+rand.IntN(100)) * time.Millisecond)
		stopWorker(ws[0])
		ws = append(ws[1:], start())
	}
	close(pubStop)
	wg.Wait()
	for {
		mu.Lock()
		n, total := len(handled), len(published)
		mu.Unlock()
		if n >= total {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d messages handled", n, total)
		case <-time.After(50 * time.Millisecond):
		}
	}
	for _, wk := range ws {
		stopWorker(wk)
	}
	mu.Lock()
	defer mu.Unlock()
	twice := 0
	for id, n := range handled {
		if n > 1 {
			twice++
		}
		if !published[id] {
			t.Errorf("message %s handled but never published", id)
		}
	}
	if len(late) > 0 || twice > 0 {
		t.Errorf("%d handler runs above attempt 1 (attempts %v), %d messages handled more than once; want none: only clean shutdowns",
			len(late), late, twice)
	}
	t.Logf("%d rolling Closes: %d messages, each handled once at attempt 1: %v", rolls, len(published), len(late) == 0 && twice == 0)
}

// TestReview_ReceiveRacingCloseKeepsAttempt: a Receive that Close
// overtakes once it has its consumer (the hook starts Close, waits for it
// to begin, and holds its hand-back back until Receive returns) returns nothing but ErrClosed, and Close hands every
// prefetched delivery back without counting an attempt: each message comes
// back at Attempt() 1. Before, Receive's select picked at random between a
// waiting delivery and Close's start, and then took the other waiting
// ones too; its caller could not Release them (ErrClosed), Close's
// hand-back no longer saw them, and they went back with the channel's
// close, one attempt up (x-delivery-count raised).
func TestReview_ReceiveRacingCloseKeepsAttempt(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	pub := newBroker(t, url, Options{Logger: quiet})
	const n = 6
	for trial := range 8 { // the old race was a coin toss per trial
		msgs := make([]*sdk.Message, n)
		for i := range msgs {
			msgs[i] = &sdk.Message{Type: "race"}
		}
		if err := pub.Publish(ctx, q, msgs...); err != nil {
			t.Fatal(err)
		}
		b := newBroker(t, url, Options{Logger: quiet, Prefetch: n})
		first, err := b.Receive(ctx, q, 1) // starts the consumer
		if err != nil {
			t.Fatal(err)
		}
		if err := first[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
		b.mu.Lock()
		c := b.consumers[q]
		b.mu.Unlock()
		for len(c.out) < n-1 { // the rest wait in the consumer, not yet returned
			select {
			case <-ctx.Done():
				t.Fatalf("trial %d: %d deliveries waiting, want %d", trial, len(c.out), n-1)
			case <-time.After(5 * time.Millisecond):
			}
		}
		closed := make(chan error, 1)
		st := c.cur.Load()
		b.receiveHook = func() {
			// Close's hand-back starts with a flush: holding flushMu keeps
			// it from collecting the waiting deliveries before this
			// Receive selects, which then meets Close begun with
			// deliveries waiting (a hand-back slowed by its flush, or a
			// Receive scheduled late, in production).
			st.flushMu.Lock()
			go func() { closed <- b.Close() }()
			for !b.closed() {
				time.Sleep(time.Millisecond)
			}
		}
		ds, err := b.Receive(ctx, q, n)
		st.flushMu.Unlock()
		for _, d := range ds {
			// What a Worker does with deliveries it will not run.
			if err := d.(sdk.Releaser).Release(ctx, 0); err != nil {
				t.Logf("trial %d: Release of a delivery received during Close: %v", trial, err)
			}
		}
		if len(ds) > 0 || !errors.Is(err, sdk.ErrClosed) {
			t.Errorf("trial %d: Receive racing Close: %d deliveries, %v; want none and ErrClosed", trial, len(ds), err)
		}
		if err := <-closed; err != nil {
			t.Fatal(err)
		}

		chk := newBroker(t, url, Options{Logger: quiet})
		seen := map[string]bool{}
		for len(seen) < n-1 {
			rctx, stop := context.WithTimeout(ctx, 10*time.Second)
			ds, err := chk.Receive(rctx, q, n)
			stop()
			if err != nil {
				t.Fatalf("trial %d: %d of %d back: %v", trial, len(seen), n-1, err)
			}
			for _, d := range ds {
				if seen[d.Message().ID] {
					t.Errorf("trial %d: %s back twice", trial, d.Message().ID)
				}
				seen[d.Message().ID] = true
				if d.Attempt() != 1 {
					t.Errorf("trial %d: %s back at attempt %d, want 1: no handler ran it", trial, d.Message().ID, d.Attempt())
				}
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := chk.Close(); err != nil {
			t.Fatal(err)
		}
		if t.Failed() {
			return
		}
	}
}
