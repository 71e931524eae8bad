package rabbitmq

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// A delay beyond the largest delay bucket, refused by Publish, reaches its
// handler through sdk.LongDelay: hops of at most the largest bucket, the
// handler run once and not before the due time.
func TestLongDelayBeyondLargestBucket(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	buckets := []time.Duration{200 * time.Millisecond, 500 * time.Millisecond}
	t.Cleanup(func() { // testQueue removes the default buckets' queues only
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer conn.Close()
		for _, ttl := range buckets {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(DelayQueue(q, ttl), false, false, false)
				_ = ch.Close()
			}
		}
	})
	b := newBroker(t, url, Options{Logger: quiet, DelayBuckets: buckets})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	const delay = 1800 * time.Millisecond
	var de *DelayError
	if err := b.Publish(ctx, q, &sdk.Message{Type: "direct", Delay: delay}); !errors.As(err, &de) {
		t.Fatalf("direct Publish of %s = %v, want *DelayError", delay, err)
	}

	ld := sdk.LongDelay{Publisher: b, Limit: buckets[len(buckets)-1]}
	ran := make(chan time.Time, 2)
	deliveries := 0
	count := func(next sdk.Handler) sdk.Handler {
		return sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error { deliveries++; return next.Handle(ctx, d) })
	}
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { ran <- time.Now(); return nil }),
		sdk.WorkerOptions{Queue: q, Concurrency: 1, Logger: slog.New(slog.DiscardHandler), Middleware: []sdk.Middleware{count, ld.Middleware()}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	var once sync.Once
	shutdown := func() {
		once.Do(func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	defer shutdown()

	start := time.Now()
	if err := ld.Publish(ctx, q, &sdk.Message{Type: "remind", Delay: delay}); err != nil {
		t.Fatalf("LongDelay.Publish: %v", err)
	}
	select {
	case at := <-ran:
		if at.Sub(start) < delay {
			t.Errorf("ran after %s, before its delay of %s", at.Sub(start), delay)
		}
	case <-ctx.Done():
		t.Fatal("the long-delayed message never ran")
	}
	select {
	case <-ran:
		t.Error("ran twice")
	case <-time.After(time.Second):
	}
	shutdown()          // deliveries is read after Run returned
	if deliveries < 2 { // the broker never saw more than 0.5s of the 1.8s
		t.Errorf("%d deliveries, want at least one hop and the run", deliveries)
	}
	t.Logf("%d deliveries (hops and the run)", deliveries)
}
