package rabbitmq

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestWorkerQueuesPrefetchIsCapacity: a Worker with several Queues starts
// each queue's consumer with its capacity (Concurrency + Prefetch) as the
// prefetch, even when the queue's first Receive asks for fewer. With weights
// 1 and 15 over 16 slots, the light queue gets one slot of the first
// sixteen, so its first Receive asks for one; the consumer used to take
// that as its prefetch for good (the server ignores a later basic.qos for
// a running consumer), and the queue never had more than one delivery in
// this process, whatever work waited. The server's ready count shows the
// prefetch: with every handler blocked nothing is settled, so the consumer
// holds exactly its prefetch unacked.
func TestWorkerQueuesPrefetchIsCapacity(t *testing.T) {
	url, busy, b := brokerOnQueue(t, Options{Logger: quiet})
	idle := testQueue(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const concurrency, prefetch, n = 8, 8, 40
	const capacity = concurrency + prefetch
	publishN(t, ctx, b, busy, "t", n)

	var started atomic.Int32
	first := make(chan struct{})
	release := make(chan struct{})
	h := sdk.HandlerFunc(func(hctx context.Context, d sdk.Delivery) error {
		if started.Add(1) == 1 {
			close(first)
		}
		select {
		case <-release:
		case <-hctx.Done():
		}
		return nil
	})
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{
		Queues:      []sdk.WorkerQueue{{Name: busy, Weight: 1}, {Name: idle, Weight: capacity - 1}},
		Concurrency: concurrency, Prefetch: prefetch, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- w.Run(wctx) }()
	defer func() {
		close(release)
		stop()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	select {
	case <-first: // the consumer of busy runs
	case <-ctx.Done():
		t.Fatal("no handler started")
	}
	b.mu.Lock()
	got := b.consumers[busy].prefetch
	b.mu.Unlock()
	if got != capacity {
		t.Fatalf("consumer of %s started with prefetch %d, want the Worker's capacity %d", busy, got, capacity)
	}

	// What the server shows: it hands the consumer exactly capacity
	// deliveries, none settled, the rest stay ready; and the Worker runs a
	// handler on each slot it can give the busy queue.
	conn := ownChannel(t, url, false)
	ready := n
	for ready > n-capacity || started.Load() < concurrency {
		select {
		case <-ctx.Done():
			t.Fatalf("%d ready, want %d (%d unacked, prefetch %d); %d handlers started, want %d",
				ready, n-capacity, n-ready, capacity, started.Load(), concurrency)
		case <-time.After(10 * time.Millisecond):
		}
		info, err := conn.QueueDeclarePassive(busy, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		ready = info.Messages
	}
	if ready != n-capacity {
		t.Fatalf("%d ready, want %d: the consumer holds %d unacked, beyond its prefetch %d", ready, n-capacity, n-ready, capacity)
	}
}
