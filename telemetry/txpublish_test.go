package telemetry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// TestPublishTxIsTracedAndCounted: publishing inside a transaction, through
// the PostgreSQL broker or through the outbox, gets the spans, trace headers
// and sent-messages counts of Publish, under its own messaging.system; what
// the transaction commits carries the trace on (to the consumer, or through
// the outbox relay), and a rolled-back transaction publishes nothing.
func TestPublishTxIsTracedAndCounted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, schema := pgtest.Schema(t, 4)
	b, err := postgres.New(pool, postgres.Options{Schema: schema, Lease: 5 * time.Second, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	box, err := outbox.New(pool, outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tp, rec := newTracing(t)
	obs, reader := newObserver(t, tp, telemetry.Options{})

	inTx := func(t *testing.T, commit bool, f func(tx pgx.Tx) error) error {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := f(tx); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if !commit {
			return tx.Rollback(ctx)
		}
		return tx.Commit(ctx)
	}

	for _, tc := range []struct {
		system string
		pub    sdk.TxPublisher[pgx.Tx]
	}{{"postgres", b}, {"outbox", box}} {
		t.Run(tc.system, func(t *testing.T) {
			queue := "tx-" + tc.system
			txp := telemetry.WrapTx(obs, tc.pub)
			if txp.Unwrap() != tc.pub {
				t.Fatal("Unwrap does not return the wrapped publisher")
			}
			rctx, request := tp.Tracer("test").Start(ctx, "request")
			one := &sdk.Message{Type: "order.paid"}
			two := []*sdk.Message{{Type: "email.receipt"}, {Type: "stock.reserve"}}
			err := inTx(t, true, func(tx pgx.Tx) error {
				if err := txp.PublishTx(rctx, tx, queue, one); err != nil {
					return err
				}
				return txp.PublishTx(rctx, tx, queue, two...)
			})
			request.End()
			if err != nil {
				t.Fatal(err)
			}

			sends := spansNamed(rec, "send "+queue)
			if len(sends) != 2 { // the single message's, and the batch's
				t.Fatalf("%d send spans, want 2", len(sends))
			}
			single := sends[0]
			if single.SpanKind() != trace.SpanKindProducer || single.Parent().SpanID() != request.SpanContext().SpanID() {
				t.Errorf("send span kind %v parent %s, want a producer under the request span", single.SpanKind(), single.Parent().SpanID())
			}
			if got := attrsOf(single)["messaging.system"].AsString(); got != tc.system {
				t.Errorf("messaging.system %q, want %q", got, tc.system)
			}
			if sc := traceparentOf(one); sc.SpanID() != single.SpanContext().SpanID() {
				t.Errorf("the message carries span %s, want its send span %s", sc.SpanID(), single.SpanContext().SpanID())
			}
			if creates := spansNamed(rec, "create "+queue); len(creates) != 2 {
				t.Errorf("%d create spans for a batch of 2", len(creates))
			}
			if one.CorrelationID == "" || one.ID == "" {
				t.Errorf("ID %q correlation %q not filled", one.ID, one.CorrelationID)
			}

			// A rolled-back transaction publishes nothing (but its attempt
			// was counted: PublishTx succeeded).
			lost := &sdk.Message{Type: "order.paid"}
			if err := inTx(t, false, func(tx pgx.Tx) error { return txp.PublishTx(ctx, tx, queue, lost) }); err != nil {
				t.Fatal(err)
			}
			// A refused message is counted as failed under its error.type.
			if err := inTx(t, true, func(tx pgx.Tx) error { return txp.PublishTx(ctx, tx, "bad queue!", &sdk.Message{}) }); !errors.Is(err, sdk.ErrInvalidQueue) {
				t.Fatalf("invalid queue: %v", err)
			}
			if s := spansNamed(rec, "send _invalid"); len(s) == 0 || s[len(s)-1].Status().Code != codes.Error {
				t.Error("the refused publish has no failed send span")
			}

			ms := collect(t, reader)
			sys := attribute.String("messaging.system", tc.system)
			if got := ms.sum("messaging.client.sent.messages", sys, semconvDest(queue)); got != 4 {
				t.Errorf("sent messages counted %v, want 4 (3 committed, 1 rolled back)", got)
			}
			if got := ms.sum("messaging.client.sent.messages", sys, telemetryErrorType("invalid_queue")); got != 1 {
				t.Errorf("failed sends counted %v, want 1", got)
			}

			// What committed reaches a consumer with the trace.
			var got []*sdk.Message
			switch tc.system {
			case "postgres":
				for len(got) < 3 {
					ds, err := b.Receive(ctx, queue, 10)
					if err != nil {
						t.Fatal(err)
					}
					for _, d := range ds {
						got = append(got, d.Message())
						_ = d.Ack(ctx)
					}
				}
			case "outbox":
				mem := newMemory(t)
				n, err := box.RelayOnce(ctx, obs.Publisher(mem), outbox.RelayOptions{})
				if err != nil || n != 3 {
					t.Fatalf("relayed %d (%v), want the 3 committed", n, err)
				}
				ds, err := mem.Receive(ctx, queue, 10)
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range ds {
					got = append(got, d.Message())
				}
				// The relay's publish continues the trace of the PublishTx
				// span (a send span for one message, a create span in a batch).
				found := false
				for _, s := range append(spansNamed(rec, "send "+queue), spansNamed(rec, "create "+queue)...) {
					if s.Parent().SpanID() == single.SpanContext().SpanID() {
						found = true
					}
				}
				if !found {
					t.Errorf("no relay send span under the PublishTx span %s", single.SpanContext().SpanID())
				}
			}
			if len(got) != 3 {
				t.Fatalf("consumer got %d messages, want the 3 committed", len(got))
			}
			for _, m := range got {
				if m.ID == lost.ID {
					t.Error("a rolled-back message was published")
				}
				if m.ID == one.ID && traceparentOf(m).TraceID() != request.SpanContext().TraceID() {
					t.Errorf("the consumed message is in trace %s, want the request's %s", traceparentOf(m).TraceID(), request.SpanContext().TraceID())
				}
			}
		})
	}
}
