package brokertest

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// testLongDelayHops publishes a message through [sdk.LongDelay] with an
// artificial limit of one second (every broker's delays, SQS's whole seconds
// included, can carry it) and a delay of 2.5 s: the message travels in hops,
// and the handler runs once, not before it is due, with the same idempotency
// key and correlation ID it was published with.
func testLongDelayHops(t *testing.T, e *env) {
	const limit, delay = time.Second, 2500 * time.Millisecond
	ld := sdk.LongDelay{Publisher: e.b, Limit: limit}
	type run struct {
		at  time.Time
		msg *sdk.Message
	}
	ran := make(chan run, 4)
	var mu sync.Mutex
	hops := 0
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		ran <- run{at: time.Now(), msg: d.Message().Clone()}
		return nil
	})
	counter := sdk.Middleware(func(next sdk.Handler) sdk.Handler {
		return sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
			mu.Lock()
			hops++
			mu.Unlock()
			return next.Handle(ctx, d)
		})
	})
	w, err := sdk.NewWorker(e.b, h, sdk.WorkerOptions{Queue: e.q, Lease: e.h.Lease, Logger: slog.New(slog.DiscardHandler),
		DrainTimeout: e.h.Timeout / 2, Middleware: []sdk.Middleware{counter, ld.Middleware()}})
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, w)

	m := textMessage("long-delayed")
	m.Delay = delay
	start := time.Now()
	if err := ld.Publish(e.ctx(t), e.q, m); err != nil {
		t.Fatalf("LongDelay.Publish: %v", err)
	}
	var got run
	select {
	case got = <-ran:
	case <-time.After(e.h.Timeout + delay):
		t.Fatalf("the long-delayed message did not run within %s", e.h.Timeout+delay)
	}
	if el := got.at.Sub(start); el < delay-clockStep {
		t.Errorf("ran %s after publish, before its delay of %s", el, delay)
	}
	if got.msg.IdempotencyKey != m.IdempotencyKey || got.msg.CorrelationID != m.CorrelationID || string(got.msg.Body) != "long-delayed" {
		t.Errorf("ran %+v, want the key %q and correlation %q of %+v", got.msg, m.IdempotencyKey, m.CorrelationID, m)
	}
	mu.Lock()
	n := hops
	mu.Unlock()
	if n < 2 { // at least one hop before the run: the broker saw no delay beyond the limit
		t.Errorf("%d deliveries, want at least one hop and the run", n)
	}
	select {
	case r := <-ran:
		t.Errorf("ran a second time: %+v", r.msg)
	case <-time.After(2 * limit):
	}
}
