package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// resolve resolves the pending result of id on the test's broker.
func resolve(t *testing.T, b *berthtest.AsyncPublisher, id string, err error) {
	t.Helper()
	if !b.Resolve(id, err) {
		t.Fatalf("%s is not pending on the broker", id)
	}
}

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// asyncOf returns p as an sdk.AsyncPublisher, failing the test when it is
// not one.
func asyncOf(t *testing.T, p sdk.Publisher) sdk.AsyncPublisher {
	t.Helper()
	ap, ok := p.(sdk.AsyncPublisher)
	if !ok {
		t.Fatalf("%T hides the broker's PublishAsync", p)
	}
	return ap
}

// spanOfMessage returns the ended span whose messaging.message.id is id.
func spanOfMessage(t *testing.T, spans []sdktrace.ReadOnlySpan, id string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range spans {
		if attrsOf(s)["messaging.message.id"].AsString() == id {
			return s
		}
	}
	t.Fatalf("no ended span for message %s", id)
	return nil
}

// TestPublisherKeepsAsyncPublish: the observer's publisher hid the broker's
// PublishAsync, so the outbox relay and sdk.NewAsyncPublisher fell back to
// the synchronous path through it. It is an sdk.AsyncPublisher exactly when
// the wrapped publisher is; PublishAsync injects the trace context before
// the broker sees the message, ends the PRODUCER span (OK, or with the
// error) and counts the message when the broker confirms or fails it,
// before the result it returns resolves, and hands back the broker's
// outcome.
func TestPublisherKeepsAsyncPublish(t *testing.T) {
	tp, rec := newTracing(t)
	obs, reader := newObserver(t, tp, telemetry.Options{})

	mem := newMemory(t)
	var plain sdk.Publisher = obs.Publisher(mem)
	if _, ok := plain.(sdk.AsyncPublisher); ok {
		t.Error("the publisher of a broker without PublishAsync claims to have it")
	}
	if u, ok := plain.(interface{ Unwrap() sdk.Publisher }); !ok || u.Unwrap() != mem {
		t.Error("Unwrap does not return the wrapped publisher")
	}

	b := berthtest.NewAsyncPublisher()
	var wrapped sdk.Publisher = obs.Publisher(b)
	pub, ok := wrapped.(sdk.AsyncPublisher)
	if !ok {
		t.Fatal("the publisher of a broker with PublishAsync hides it")
	}
	if u, ok := wrapped.(interface{ Unwrap() sdk.Publisher }); !ok || u.Unwrap() != b {
		t.Error("Unwrap does not return the wrapped publisher")
	}

	ctx, caller := tp.Tracer("test").Start(sdk.WithCorrelationID(context.Background(), "corr-1"), "checkout")
	good := &sdk.Message{Type: "order.paid"}
	bad := &sdk.Message{Type: "order.paid"}
	rg, err := pub.PublishAsync(ctx, "q", good)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := pub.PublishAsync(ctx, "q", bad)
	if err != nil {
		t.Fatal(err)
	}
	caller.End()
	if good.ID == "" || rg.ID() != good.ID || rb.ID() != bad.ID {
		t.Errorf("result IDs %q, %q for messages %q, %q", rg.ID(), rb.ID(), good.ID, bad.ID)
	}
	if good.CorrelationID != "corr-1" {
		t.Errorf("correlation ID %q, want the context's", good.CorrelationID)
	}
	// The trace context was in the headers the broker was handed.
	for _, m := range []*sdk.Message{good, bad} {
		h := b.Message(m.ID)
		if h == nil {
			t.Fatalf("%s not handed to PublishAsync", m.ID)
		}
		if sc := traceparentOf(h); !sc.IsValid() || sc.TraceID() != caller.SpanContext().TraceID() {
			t.Errorf("message handed to the broker carries trace context %v, want one in the caller's trace", sc)
		}
	}
	if n := len(spansNamed(rec, "send q")); n != 0 {
		t.Fatalf("%d send spans ended before the broker confirmed anything, want none", n)
	}
	select {
	case <-rg.Done():
		t.Fatal("the result resolved before the broker's")
	default:
	}

	nacked := fmt.Errorf("nacked: %w", sdk.ErrUnavailable)
	resolve(t, b, good.ID, nil)
	if err := rg.Wait(waitCtx(t)); err != nil {
		t.Errorf("confirmed publish: %v", err)
	}
	// Ended before the result resolved.
	sends := spansNamed(rec, "send q")
	if len(sends) != 1 {
		t.Fatalf("%d send spans ended when the confirmed result resolved, want 1", len(sends))
	}
	resolve(t, b, bad.ID, nacked)
	if err := rb.Wait(waitCtx(t)); !errors.Is(err, nacked) {
		t.Errorf("failed publish: %v, want the broker's error", err)
	}
	sends = spansNamed(rec, "send q")
	if len(sends) != 2 {
		t.Fatalf("%d send spans, want 2", len(sends))
	}

	sg := spanOfMessage(t, sends, good.ID)
	if sg.SpanKind() != trace.SpanKindProducer || sg.Parent().SpanID() != caller.SpanContext().SpanID() {
		t.Errorf("send span kind %v parent %s, want a producer under the caller's span", sg.SpanKind(), sg.Parent().SpanID())
	}
	if sg.Status().Code != codes.Unset {
		t.Errorf("confirmed send span status %v, want unset", sg.Status())
	}
	a := attrsOf(sg)
	if a["messaging.destination.name"].AsString() != "q" || a["messaging.message.conversation_id"].AsString() != "corr-1" || a["berth.job.type"].AsString() != "order.paid" {
		t.Errorf("send span attributes %v", a)
	}
	if sc := traceparentOf(good); sc.SpanID() != sg.SpanContext().SpanID() {
		t.Errorf("the message carries span %s, want its send span %s", sc.SpanID(), sg.SpanContext().SpanID())
	}
	sb := spanOfMessage(t, sends, bad.ID)
	if sb.Status().Code != codes.Error || attrsOf(sb)["error.type"].AsString() != "unavailable" {
		t.Errorf("failed send span status %v error.type %q, want error and unavailable", sb.Status(), attrsOf(sb)["error.type"].AsString())
	}
	if len(sb.Events()) == 0 || sb.Events()[0].Name != "exception" {
		t.Errorf("failed send span events %v, want the exception", sb.Events())
	}

	// A message the broker refuses at once fails its span at once.
	if _, err := pub.PublishAsync(ctx, "bad queue!", &sdk.Message{}); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("PublishAsync to a bad queue = %v, want ErrInvalidQueue", err)
	}
	if s := spansNamed(rec, "send _invalid"); len(s) != 1 || s[0].Status().Code != codes.Error {
		t.Error("the refused publish has no failed send span")
	}
	if _, err := pub.PublishAsync(ctx, "q", nil); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("PublishAsync of nil = %v, want the broker's ErrInvalidMessage", err)
	}

	ms := collect(t, reader)
	if got := ms.sum("messaging.client.sent.messages", semconvDest("q")); got != 2 {
		t.Errorf("sent messages to q counted %v, want 2", got)
	}
	if got := ms.sum("messaging.client.sent.messages", semconvDest("q"), telemetryErrorType("unavailable")); got != 1 {
		t.Errorf("failed sends counted %v, want 1", got)
	}
	if got := ms.sum("messaging.client.sent.messages", telemetryErrorType("invalid_queue")); got != 1 {
		t.Errorf("refused sends counted %v, want 1", got)
	}
	if n := b.SyncCalls(); n != 0 {
		t.Errorf("%d synchronous Publish calls, want none", n)
	}
}

// TestPublisherAsyncThroughPoolAndLedger: sdk.NewAsyncPublisher over the
// observer's publisher, and the ledger's publisher over it (the order
// ledger's docs give), pass calls to the broker's own PublishAsync; a
// result that resolved before the observer's publisher saw it (inside the
// broker's PublishAsync) ends its span and resolves too.
func TestPublisherAsyncThroughPoolAndLedger(t *testing.T) {
	tp, rec := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{})
	refused := errors.New("refused")
	b := berthtest.NewAsyncPublisher()
	b.ResolveAtOnce(func(m *sdk.Message) error {
		if m.ID == "no" {
			return refused
		}
		return nil
	})
	pool := sdk.NewAsyncPublisher(obs.Publisher(b), sdk.AsyncOptions{})
	t.Cleanup(func() { _ = pool.Close() })

	l, err := ledger.New(ledger.Options{Store: &ledgerEvents{}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	viaLedger, ok := l.Publisher(obs.Publisher(b)).(sdk.AsyncPublisher)
	if !ok {
		t.Fatal("the ledger's publisher over the observer's hides PublishAsync")
	}

	for _, ap := range []sdk.AsyncPublisher{pool, viaLedger} {
		for _, id := range []string{"yes", "no"} {
			r, err := ap.PublishAsync(context.Background(), "q", &sdk.Message{ID: id})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Wait(waitCtx(t)); (id == "no") != errors.Is(err, refused) {
				t.Errorf("result of %s: %v", id, err)
			}
		}
	}
	sends := spansNamed(rec, "send q")
	if len(sends) != 4 {
		t.Fatalf("%d send spans, want 4", len(sends))
	}
	for _, s := range sends {
		want := codes.Unset
		if attrsOf(s)["messaging.message.id"].AsString() == "no" {
			want = codes.Error
		}
		if s.Status().Code != want {
			t.Errorf("span of %s: status %v, want %v", attrsOf(s)["messaging.message.id"].AsString(), s.Status().Code, want)
		}
	}
	if n := b.SyncCalls(); n != 0 {
		t.Errorf("%d synchronous Publish calls, want none", n)
	}
}

// ledgerEvents is a ledger Store that keeps nothing.
type ledgerEvents struct{}

func (ledgerEvents) Write(context.Context, []ledger.Event) error { return nil }

// TestAsyncPublishDoesNotWaitOnTheConfirmingGoroutine: the broker's
// confirming goroutine resolves many results while nobody waits for them;
// it returns at once (the span ends and the message is counted on it,
// nothing more), and every result is resolved afterwards.
func TestAsyncPublishDoesNotWaitOnTheConfirmingGoroutine(t *testing.T) {
	tp, rec := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{})
	b := berthtest.NewAsyncPublisher()
	pub := asyncOf(t, obs.Publisher(b))
	const n = 200
	results := make([]*sdk.PublishResult, n)
	for i := range results {
		r, err := pub.PublishAsync(context.Background(), "q", &sdk.Message{ID: fmt.Sprint("m", i)})
		if err != nil {
			t.Fatal(err)
		}
		results[i] = r
	}
	confirmed := make(chan struct{})
	go func() {
		defer close(confirmed)
		for i := range n {
			if !b.Resolve(fmt.Sprint("m", i), nil) {
				t.Errorf("m%d is not pending on the broker", i)
			}
		}
	}()
	select {
	case <-confirmed:
	case <-time.After(10 * time.Second):
		t.Fatal("the confirming goroutine is blocked")
	}
	for _, r := range results {
		select {
		case <-r.Done():
		default:
			t.Fatal("a result the broker confirmed is unresolved")
		}
	}
	if got := len(spansNamed(rec, "send q")); got != n {
		t.Errorf("%d send spans, want %d", got, n)
	}
}
