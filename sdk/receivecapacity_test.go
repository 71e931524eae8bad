package sdk_test

import (
	"context"
	"sync"
	"testing"

	"github.com/berthq/berth/sdk"
)

// capacitySub records the receive capacity each Receive's ctx carries and
// how many slots it asked for.
type capacitySub struct {
	sdk.Subscriber
	mu   sync.Mutex
	got  []receiveCall
	seen chan struct{}
}

type receiveCall struct {
	queue         string
	max, capacity int
}

func (c *capacitySub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	c.mu.Lock()
	c.got = append(c.got, receiveCall{queue, max, sdk.ReceiveCapacity(ctx)})
	c.mu.Unlock()
	select {
	case c.seen <- struct{}{}:
	default:
	}
	return c.Subscriber.Receive(ctx, queue, max)
}

// TestWorkerReceiveCapacity: every Receive of a Worker carries its capacity
// (Concurrency + Prefetch, sdk.ReceiveCapacity), whatever max it asks for:
// with several Queues a queue's first Receive asks only for the slots it
// was handed, and a broker sizing its prefetch by that max (RabbitMQ) kept
// it that small for good.
func TestWorkerReceiveCapacity(t *testing.T) {
	if n := sdk.ReceiveCapacity(context.Background()); n != 0 {
		t.Fatalf("ReceiveCapacity without one = %d, want 0", n)
	}
	for _, queues := range [][]sdk.WorkerQueue{{{Name: "one"}}, {{Name: "light", Weight: 1}, {Name: "heavy", Weight: 4}}} {
		b := newMem(t)
		sub := &capacitySub{Subscriber: b, seen: make(chan struct{}, 1)}
		ok := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
		w, err := sdk.NewWorker(sub, ok, sdk.WorkerOptions{Queues: queues, Concurrency: 3, Prefetch: 2, Logger: mqQuiet()})
		if err != nil {
			t.Fatal(err)
		}
		stop := runMQ(t, w)
		for asked := map[string]bool{}; len(asked) < len(queues); {
			<-sub.seen
			sub.mu.Lock()
			for _, c := range sub.got {
				asked[c.queue] = true
			}
			sub.mu.Unlock()
		}
		stop()
		sub.mu.Lock()
		for _, c := range sub.got {
			if c.capacity != 5 {
				t.Errorf("Receive(%s, max %d) carried capacity %d, want 5", c.queue, c.max, c.capacity)
			}
		}
		sub.mu.Unlock()
	}
}
