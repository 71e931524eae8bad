package telemetry_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// TestTwoObserversOnOneWorker: two Observers (say, two exporters' worth of
// telemetry) on one Worker each see every delivery and settle their own
// span and in-flight count. A message published without trace headers, to a
// Worker whose own context carries a span, starts a trace of its own rather
// than joining that span.
func TestTwoObserversOnOneWorker(t *testing.T) {
	b := newMemory(t)
	queue := uniqueQueue(t, "to")
	tp1, rec1 := newTracing(t)
	tp2, rec2 := newTracing(t)
	obs1, reader1 := newObserver(t, tp1, telemetry.Options{})
	obs2, reader2 := newObserver(t, tp2, telemetry.Options{})
	const n = 3
	for range n {
		if err := b.Publish(context.Background(), queue, &sdk.Message{Type: "plain"}); err != nil { // no telemetry publisher: no trace headers
			t.Fatal(err)
		}
	}
	handled := make(chan struct{}, n)
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		handled <- struct{}{}
		return nil
	}), sdk.WorkerOptions{Queue: queue, Observers: []sdk.Observer{obs1, obs2}, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, runSpan := tp1.Tracer("test").Start(context.Background(), "worker-run")
	runCtx, cancel := context.WithCancel(runCtx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	for range n {
		<-handled
	}
	eventually(t, 10*time.Second, "every delivery settled", func() bool {
		return collect(t, reader1).sum("berth.delivery.settlements") == n && collect(t, reader2).sum("berth.delivery.settlements") == n
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !runSpan.IsRecording() {
		t.Error("a Settled ended the Worker's own span")
	}
	runSpan.End()

	for i, rec := range []*struct {
		spans int
		inFl  float64
	}{
		{len(spansNamed(rec1, "process "+queue)), collect(t, reader1).sum("berth.worker.in_flight")},
		{len(spansNamed(rec2, "process "+queue)), collect(t, reader2).sum("berth.worker.in_flight")},
	} {
		if rec.spans != n || rec.inFl != 0 {
			t.Errorf("observer %d: %d process spans, in-flight %v; want %d and 0", i+1, rec.spans, rec.inFl, n)
		}
	}
	for _, p := range spansNamed(rec1, "process "+queue) {
		if p.Parent().IsValid() || p.SpanContext().TraceID() == runSpan.SpanContext().TraceID() {
			t.Error("a message without trace headers joined the Worker's span")
		}
		if len(p.Links()) != 0 {
			t.Errorf("links %v on a message without trace headers", p.Links())
		}
	}
}

// TestSettledWithoutStartIsHarmless: an Observer told of a settlement it did
// not start (another Observer's context) records the settlement and leaves
// the spans in the context alone.
func TestSettledWithoutStartIsHarmless(t *testing.T) {
	b := newMemory(t)
	queue := uniqueQueue(t, "ts")
	tp, _ := newTracing(t)
	obs, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{})
	if err := b.Publish(context.Background(), queue, &sdk.Message{Type: "t"}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(context.Background(), queue, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %v, %d deliveries", err, len(ds))
	}
	ctx, span := tp.Tracer("test").Start(context.Background(), "caller")
	obs.Settled(ctx, ds[0], sdk.Settlement{Action: sdk.ActionAck})
	if !span.IsRecording() {
		t.Error("Settled ended a span it did not start")
	}
	span.End()
	if got := collect(t, reader).sum("berth.delivery.settlements"); got != 1 {
		t.Errorf("settlements %v, want 1", got)
	}
	if err := ds[0].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestClaimToAckWithoutReceived: an Observer driven by something other than
// a Worker, whose settlements carry no Received time, measures claim-to-ack
// from the start of handling (Duration before the settlement); one with
// neither records no claim-to-ack at all.
func TestClaimToAckWithoutReceived(t *testing.T) {
	b := newMemory(t)
	queue := uniqueQueue(t, "cta")
	obs, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{})
	ctx := context.Background()
	if err := b.Publish(ctx, queue, &sdk.Message{Type: "a"}, &sdk.Message{Type: "a"}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, queue, 2)
	if err != nil || len(ds) != 2 {
		t.Fatalf("Receive: %d deliveries, %v", len(ds), err)
	}
	const took = 250 * time.Millisecond
	hctx := obs.Start(ctx, ds[0])
	obs.Settled(hctx, ds[0], sdk.Settlement{Action: sdk.ActionAck, Duration: took})
	hctx = obs.Start(ctx, ds[1])
	obs.Settled(hctx, ds[1], sdk.Settlement{Action: sdk.ActionAck})
	ms := collect(t, reader)
	const name = "berth.delivery.claim_to_ack.duration"
	if n := ms.sum(name); n != 1 {
		t.Fatalf("%s has %v points, want 1 (the settlement with a Duration)", name, n)
	}
	if s := ms.histSum(name); s != took.Seconds() {
		t.Errorf("%s sums to %vs, want %vs (the handling time)", name, s, took.Seconds())
	}
	for _, d := range ds {
		_ = d.Ack(ctx)
	}
}
