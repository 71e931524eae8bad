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
