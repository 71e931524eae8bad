package telemetry_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// countingRabbit counts the synchronous Publish calls made on a RabbitMQ
// broker (its PublishAsync is the broker's own).
type countingRabbit struct {
	*rabbitmq.Broker
	sync atomic.Int32
}

func (c *countingRabbit) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	c.sync.Add(1)
	return c.Broker.Publish(ctx, queue, msgs...)
}

// TestRelayThroughObserverUsesAsyncPublish: an outbox relay publishing to
// RabbitMQ through the observer's publisher fell back to the synchronous
// Publish, as the wrapper hid PublishAsync. It takes the asynchronous path;
// every relayed row gets its send span, under the span that wrote it into
// the outbox, ended without error, and reaches the consumer carrying that
// span's context; the row RabbitMQ refuses (too large) gets a failed span.
// A message RabbitMQ fails after accepting it (returned unroutable) ends
// its span with the error when the broker says so.
func TestRelayThroughObserverUsesAsyncPublish(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := integration.RabbitMQURL(t)
	pool, schema := pgtest.Schema(t, 4)
	box, err := outbox.New(pool, outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rb, err := rabbitmq.New(ctx, url, rabbitmq.Options{QueueType: rabbitmq.Classic, MaxMessageSize: 1024, MaxInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rb.Close() })
	q := uniqueQueue(t, "berth_telasync")
	if err := rb.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rb.DeleteQueue(context.Background(), q) })
	tp, rec := newTracing(t)
	obs, reader := newObserver(t, tp, telemetry.Options{})

	// The rows, each written into the outbox under a request span.
	msgs := []*sdk.Message{{Type: "a"}, {Type: "big", Body: make([]byte, 2048)}}
	for range 30 { // more than MaxInFlight: the window slides
		msgs = append(msgs, &sdk.Message{Type: "more"})
	}
	writer := telemetry.WrapTx(obs, box)
	rctx, request := tp.Tracer("test").Start(ctx, "request")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := writer.PublishTx(rctx, tx, q, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	request.End()
	written := map[string]string{} // message ID → span ID of its PublishTx send span
	for _, s := range spansNamed(rec, "send "+q) {
		written[attrsOf(s)["messaging.message.id"].AsString()] = s.SpanContext().SpanID().String()
	}

	b := &countingRabbit{Broker: rb}
	n, err := box.RelayOnce(ctx, obs.Publisher(b), outbox.RelayOptions{Backoff: sdk.Backoff{Base: time.Hour, Max: time.Hour}, MaxAttempts: 3})
	if n != len(msgs)-1 || !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Fatalf("RelayOnce = %d, %v; want %d published and the refusal reported", n, err, len(msgs)-1)
	}
	if c := b.sync.Load(); c != 0 {
		t.Errorf("%d synchronous Publish calls through the observer's publisher, want none (PublishAsync)", c)
	}

	relayed := map[string]string{} // message ID → span ID of its relay send span
	for _, s := range spansNamed(rec, "send "+q) {
		a := attrsOf(s)
		if a["messaging.system"].AsString() == "outbox" {
			continue // written, not relayed
		}
		id := a["messaging.message.id"].AsString()
		if _, dup := relayed[id]; dup {
			t.Errorf("two relay send spans for %s", id)
		}
		relayed[id] = s.SpanContext().SpanID().String()
		if got, want := s.Parent().SpanID().String(), written[id]; got != want {
			t.Errorf("relay send span of %s under %s, want under its outbox write %s", id, got, want)
		}
		wantCode := codes.Unset
		if id == msgs[1].ID {
			wantCode = codes.Error
			if et := a["error.type"].AsString(); et != "message_too_large" {
				t.Errorf("refused row's span error.type %q, want message_too_large", et)
			}
		}
		if s.Status().Code != wantCode {
			t.Errorf("relay send span of %s: status %v, want %v", id, s.Status(), wantCode)
		}
	}
	if len(relayed) != len(msgs) {
		t.Fatalf("%d relay send spans, want %d (one per row)", len(relayed), len(msgs))
	}

	// The consumer gets the trace context of each message's relay span.
	got := 0
	for got < len(msgs)-1 {
		ds, err := rb.Receive(ctx, q, 50)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			m := d.Message()
			if sc := traceparentOf(m); sc.SpanID().String() != relayed[m.ID] {
				t.Errorf("message %s carries span %s, want its relay send span %s", m.ID, sc.SpanID(), relayed[m.ID])
			}
			if sc := traceparentOf(m); sc.TraceID() != request.SpanContext().TraceID() {
				t.Errorf("message %s in trace %s, want the request's", m.ID, sc.TraceID())
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			got++
		}
	}

	ms := collect(t, reader)
	if c := ms.sum("messaging.client.sent.messages", semconvDest(q), telemetryErrorType("message_too_large")); c != 1 {
		t.Errorf("refused sends counted %v, want 1", c)
	}

	// Accepted by PublishAsync, failed later by the broker.
	nd, err := rabbitmq.New(ctx, url, rabbitmq.Options{NoDeclare: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nd.Close() })
	missing := uniqueQueue(t, "berth_telasync_missing")
	ap := asyncOf(t, obs.Publisher(nd))
	r, err := ap.PublishAsync(ctx, missing, &sdk.Message{Type: "lost"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Wait(ctx); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("publish to a missing queue: %v, want ErrNotFound (unroutable)", err)
	}
	if s := spansNamed(rec, "send "+missing); len(s) != 1 || s[0].Status().Code != codes.Error || len(s[0].Events()) == 0 {
		t.Errorf("the unroutable message's send span: %v, want one ended with the error", s)
	}
}
