package telemetry_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// syncBuffer is a log buffer the Worker's goroutines share, read as JSON
// lines.
type syncBuffer struct{ syncbuf.Buffer }

func (b *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l == "" {
			continue
		}
		if strings.Count(l, `"correlation_id"`) > 1 {
			t.Errorf("correlation_id twice in %s", l)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func traceparentOf(m *sdk.Message) trace.SpanContext {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(m.Headers))
	return trace.SpanContextFromContext(ctx)
}

// TestCorrelationIDReachesLogsAndFollowUpMessages publishes a job with a
// correlation ID in the context; its handler logs and publishes a follow-up
// job. The handler's log record carries the correlation ID, trace and span
// IDs, job type and attempt; the follow-up message carries the correlation ID
// and continues the trace. A job published without a correlation ID gets a
// generated one, which its handler sees too. The Worker's own logs, written
// through the same handler, carry the ID once.
func TestCorrelationIDReachesLogsAndFollowUpMessages(t *testing.T) {
	b := newMemory(t)
	queue, next := uniqueQueue(t, "tc"), uniqueQueue(t, "tc_next")
	tp, rec := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{})
	pub := obs.Publisher(b)
	var logs syncBuffer
	logger := slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))

	ctx := sdk.WithCorrelationID(context.Background(), "corr-order-123")
	ctx, root := tp.Tracer("test").Start(ctx, "checkout")
	if err := pub.Publish(ctx, queue, &sdk.Message{Type: "billing.charge", Body: []byte("order_123")}); err != nil {
		t.Fatal(err)
	}
	root.End()
	anon := &sdk.Message{Type: "billing.charge", Body: []byte("order_456")}
	if err := pub.Publish(context.Background(), queue, anon); err != nil {
		t.Fatal(err)
	}
	if anon.CorrelationID == "" {
		t.Fatal("publish without a correlation ID did not generate one")
	}

	var handled sync.WaitGroup
	handled.Add(2)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		defer handled.Done()
		if d.Attempt() == 1 && string(d.Message().Body) == "order_456" {
			handled.Add(1)
			return errors.New("payment gateway timeout") // so the Worker logs a retry
		}
		logger.InfoContext(ctx, "charging", "order", string(d.Message().Body))
		return pub.Publish(ctx, next, &sdk.Message{Type: "email.receipt", Body: d.Message().Body})
	})
	stop := runWorker(t, b, h, sdk.WorkerOptions{
		Queue:       queue,
		Concurrency: 1,
		Retry:       sdk.RetryPolicy{Backoff: sdk.Backoff{Base: 10 * time.Millisecond, Jitter: -1}},
		Observers:   []sdk.Observer{obs},
		Logger:      logger,
	})
	handled.Wait()
	stop()

	// The follow-up messages.
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var follow []*sdk.Message
	for len(follow) < 2 {
		ds, err := b.Receive(rctx, next, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			follow = append(follow, d.Message())
			if err := d.Ack(rctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	procs := spansNamed(rec, "process "+queue)
	procBySpan := map[trace.SpanID]bool{}
	for _, p := range procs {
		procBySpan[p.SpanContext().SpanID()] = true
	}
	sendsNext := spansNamed(rec, "send "+next)
	parentOf := map[trace.SpanID]trace.SpanID{}
	for _, s := range sendsNext {
		parentOf[s.SpanContext().SpanID()] = s.Parent().SpanID()
	}
	want := map[string]string{"order_123": "corr-order-123", "order_456": anon.CorrelationID}
	for _, m := range follow {
		if got := m.CorrelationID; got != want[string(m.Body)] {
			t.Errorf("follow-up of %s has correlation ID %q, want %q", m.Body, got, want[string(m.Body)])
		}
		sc := traceparentOf(m)
		if !procBySpan[parentOf[sc.SpanID()]] {
			t.Errorf("follow-up of %s: its send span is not a child of a process span", m.Body)
		}
		if string(m.Body) == "order_123" && sc.TraceID() != root.SpanContext().TraceID() {
			t.Errorf("follow-up of order_123 is in trace %s, want the checkout trace %s", sc.TraceID(), root.SpanContext().TraceID())
		}
	}

	// The logs.
	var charging, workerLogs int
	for _, l := range logs.lines(t) {
		switch l["msg"] {
		case "charging":
			charging++
			order := l["order"].(string)
			if l["correlation_id"] != want[order] {
				t.Errorf("log of %s: correlation_id %v, want %q", order, l["correlation_id"], want[order])
			}
			if l["job_type"] != "billing.charge" {
				t.Errorf("log of %s: job_type %v", order, l["job_type"])
			}
			if order == "order_123" && l["attempt"] != float64(1) {
				t.Errorf("log of order_123: attempt %v, want 1", l["attempt"])
			}
			if order == "order_456" && l["attempt"] != float64(2) {
				t.Errorf("log of order_456: attempt %v, want 2", l["attempt"])
			}
			tid, _ := trace.TraceIDFromHex(l["trace_id"].(string))
			sid, _ := trace.SpanIDFromHex(l["span_id"].(string))
			if !procBySpan[sid] {
				t.Errorf("log of %s: span_id %v is not a process span", order, l["span_id"])
			}
			if order == "order_123" && tid != root.SpanContext().TraceID() {
				t.Errorf("log of order_123: trace_id %v, want %s", l["trace_id"], root.SpanContext().TraceID())
			}
		default:
			if l["correlation_id"] != nil {
				workerLogs++
			}
		}
	}
	if charging != 2 {
		t.Errorf("got %d charging logs, want 2", charging)
	}
	if workerLogs == 0 {
		t.Error("no Worker log carried the correlation ID")
	}
}

// TestBatchPublishLinksOneCreateSpanPerMessage checks a batch: a PRODUCER
// "create" span per message, whose context each message carries, and a CLIENT
// "send" span linked to all of them; a header map shared by the messages is
// left untouched.
func TestBatchPublishLinksOneCreateSpanPerMessage(t *testing.T) {
	b := newMemory(t)
	queue := uniqueQueue(t, "tb")
	tp, rec := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{})
	ctx, root := tp.Tracer("test").Start(context.Background(), "import")
	shared := map[string]string{"tenant": "acme"}
	msgs := []*sdk.Message{{Headers: shared}, {Headers: shared}, {Headers: shared}}
	if err := obs.Publisher(b).Publish(ctx, queue, msgs...); err != nil {
		t.Fatal(err)
	}
	root.End()
	if len(shared) != 1 {
		t.Errorf("the shared header map was written to: %v", shared)
	}
	creates := spansNamed(rec, "create "+queue)
	sends := spansNamed(rec, "send "+queue)
	if len(creates) != 3 || len(sends) != 1 {
		t.Fatalf("got %d create and %d send spans, want 3 and 1", len(creates), len(sends))
	}
	send := sends[0]
	if send.SpanKind() != trace.SpanKindClient {
		t.Errorf("batch send span kind %v, want client", send.SpanKind())
	}
	if got := attrsOf(send)["messaging.batch.message_count"].AsInt64(); got != 3 {
		t.Errorf("batch message count %d, want 3", got)
	}
	linked := map[trace.SpanID]bool{}
	for _, l := range send.Links() {
		linked[l.SpanContext.SpanID()] = true
	}
	byID := map[trace.SpanID]bool{}
	for _, c := range creates {
		byID[c.SpanContext().SpanID()] = true
		if c.SpanKind() != trace.SpanKindProducer || c.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("create span: kind %v parent %s, want producer under the caller's span", c.SpanKind(), c.Parent().SpanID())
		}
		if !linked[c.SpanContext().SpanID()] {
			t.Errorf("send span not linked to create span %s", c.SpanContext().SpanID())
		}
	}
	for i, m := range msgs {
		if sc := traceparentOf(m); !byID[sc.SpanID()] {
			t.Errorf("message %d carries span %s, not a create span", i, sc.SpanID())
		}
		if m.Header("tenant") != "acme" {
			t.Errorf("message %d lost its header", i)
		}
	}
}

// TestPublishFailureIsRecorded: a publish the broker refuses ends its span
// with an error and counts the message as failed.
func TestPublishFailureIsRecorded(t *testing.T) {
	b := newMemory(t)
	tp, rec := newTracing(t)
	obs, reader := newObserver(t, tp, telemetry.Options{})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	err := obs.Publisher(b).Publish(context.Background(), "tf", &sdk.Message{})
	if !errors.Is(err, sdk.ErrClosed) {
		t.Fatalf("publish on a closed broker: %v, want ErrClosed", err)
	}
	spans := spansNamed(rec, "send tf")
	if len(spans) != 1 {
		t.Fatalf("got %d send spans, want 1", len(spans))
	}
	if s := spans[0]; s.Status().Code != codes.Error || attrsOf(s)["error.type"].AsString() != "closed" {
		t.Errorf("send span status %v error.type %q, want error and closed", s.Status(), attrsOf(s)["error.type"].AsString())
	}
	ms := collect(t, reader)
	if got := ms.sum("messaging.client.sent.messages", telemetryErrorType("closed")); got != 1 {
		t.Errorf("failed sends counted %v, want 1", got)
	}

	// Invalid queue names share one label set, whatever the name.
	b2 := newMemory(t)
	for _, bad := range []string{"bad queue!", "", ".hidden"} {
		if err := obs.Publisher(b2).Publish(context.Background(), bad, &sdk.Message{}); !errors.Is(err, sdk.ErrInvalidQueue) {
			t.Errorf("publish to %q: %v, want ErrInvalidQueue", bad, err)
		}
	}
	ms = collect(t, reader)
	if got := ms.sum("messaging.client.sent.messages", semconvDest("_invalid"), telemetryErrorType("invalid_queue")); got != 3 {
		t.Errorf("sends to invalid queues counted %v under _invalid, want 3", got)
	}
}

// TestLinkOnlyStartsANewTraceKeepingBaggage: with LinkOnly the process span is
// a root linked to the send span, and the message's baggage still reaches the
// handler.
func TestLinkOnlyStartsANewTraceKeepingBaggage(t *testing.T) {
	b := newMemory(t)
	queue := uniqueQueue(t, "tl")
	tp, rec := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{LinkOnly: true})
	member, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	ctx := baggage.ContextWithBaggage(context.Background(), bag)
	if err := obs.Publisher(b).Publish(ctx, queue, &sdk.Message{Type: "t"}); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	stop := runWorker(t, b, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		got <- baggage.FromContext(ctx).Member("tenant").Value()
		return nil
	}), sdk.WorkerOptions{Queue: queue, Observers: []sdk.Observer{obs}})
	if v := <-got; v != "acme" {
		t.Errorf("handler baggage tenant=%q, want acme", v)
	}
	eventually(t, 10*time.Second, "the process span", func() bool { return len(spansNamed(rec, "process "+queue)) == 1 })
	stop()
	send, proc := spansNamed(rec, "send "+queue)[0], spansNamed(rec, "process "+queue)[0]
	if proc.Parent().IsValid() || proc.SpanContext().TraceID() == send.SpanContext().TraceID() {
		t.Error("LinkOnly process span is not the root of a new trace")
	}
	if ls := proc.Links(); len(ls) != 1 || ls[0].SpanContext.SpanID() != send.SpanContext().SpanID() {
		t.Errorf("LinkOnly process span links %v, want the send span", ls)
	}
}

// TestPublishContinuesATraceCarriedByTheMessage: a message written with
// Inject under a request's span (as an outbox row would be) and published
// later outside any span (by a relay) gets its send span in the request's
// trace.
func TestPublishContinuesATraceCarriedByTheMessage(t *testing.T) {
	b := newMemory(t)
	queue := uniqueQueue(t, "tr")
	tp, rec := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{})
	ctx, request := tp.Tracer("test").Start(context.Background(), "place-order")
	m := &sdk.Message{Type: "billing.charge"}
	telemetry.Inject(ctx, nil, m) // in the business transaction
	request.End()

	if err := obs.Publisher(b).Publish(context.Background(), queue, m); err != nil { // the relay, later
		t.Fatal(err)
	}
	sends := spansNamed(rec, "send "+queue)
	if len(sends) != 1 {
		t.Fatalf("got %d send spans, want 1", len(sends))
	}
	if s := sends[0]; s.Parent().SpanID() != request.SpanContext().SpanID() || s.SpanContext().TraceID() != request.SpanContext().TraceID() {
		t.Errorf("send span parent %s in trace %s, want the request span %s", s.Parent().SpanID(), s.SpanContext().TraceID(), request.SpanContext().SpanID())
	}
	if sc := traceparentOf(m); sc.SpanID() != sends[0].SpanContext().SpanID() {
		t.Errorf("the message carries span %s, want its send span", sc.SpanID())
	}
}

// TestCorrelationHeader: with Options.CorrelationHeader the Publisher also
// writes the correlation ID under that header, and the Observer takes it
// from there for a message that arrives without a CorrelationID.
func TestCorrelationHeader(t *testing.T) {
	b := newMemory(t)
	queue := uniqueQueue(t, "th")
	tp, _ := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{CorrelationHeader: "x-correlation-id"})
	m := &sdk.Message{Type: "t"}
	if err := obs.Publisher(b).Publish(sdk.WithCorrelationID(context.Background(), "corr-7"), queue, m); err != nil {
		t.Fatal(err)
	}
	if got := m.Header("x-correlation-id"); got != "corr-7" {
		t.Errorf("x-correlation-id header %q, want corr-7", got)
	}

	ds, err := b.Receive(context.Background(), queue, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %v, %d deliveries", err, len(ds))
	}
	foreign := ds[0].Message().Clone()
	foreign.CorrelationID = ""
	foreign.Headers = map[string]string{"x-correlation-id": "ext-9"}
	// The same message as a producer outside berth would have sent it.
	fd := berthtest.NewDelivery(foreign, berthtest.Queue(queue))
	ctx := obs.Start(context.Background(), fd)
	if got := sdk.CorrelationID(ctx); got != "ext-9" {
		t.Errorf("handler correlation ID %q, want ext-9 from the header", got)
	}
	obs.Settled(ctx, fd, sdk.Settlement{Action: sdk.ActionAck})
	if err := ds[0].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestNewTraceparentDropsTheOldTracestate: a message that already carries a
// trace context (written into an outbox row, say, under a span whose
// tracestate had a vendor's entry) and is published inside another trace
// gets that trace's traceparent; the old tracestate, which belongs to the
// old traceparent (W3C Trace Context), went along with the new one.
func TestNewTraceparentDropsTheOldTracestate(t *testing.T) {
	ts, err := trace.ParseTraceState("vendor=old")
	if err != nil {
		t.Fatal(err)
	}
	old := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2},
		TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true})
	oldCtx := trace.ContextWithRemoteSpanContext(context.Background(), old)

	b := newMemory(t)
	queue := uniqueQueue(t, "ts")
	tp, _ := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{})
	for _, via := range []string{"Publisher", "Inject"} {
		m := &sdk.Message{Type: "t", Headers: map[string]string{"app": "kept"}}
		telemetry.Inject(oldCtx, nil, m)
		if m.Header("tracestate") != "vendor=old" {
			t.Fatalf("set-up: headers %v", m.Headers)
		}
		ctx, span := tp.Tracer("test").Start(context.Background(), "relay") // a new trace, no tracestate
		if via == "Publisher" {
			if err := obs.Publisher(b).Publish(ctx, queue, m); err != nil {
				t.Fatal(err)
			}
		} else {
			telemetry.Inject(ctx, nil, m)
		}
		span.End()
		if got := traceparentOf(m).TraceID(); got != span.SpanContext().TraceID() {
			t.Fatalf("%s: the message is in trace %s, want %s", via, got, span.SpanContext().TraceID())
		}
		if got := m.Header("tracestate"); got != "" {
			t.Errorf("%s: the traceparent of trace %s goes with the tracestate %q of trace %s", via, span.SpanContext().TraceID(), got, old.TraceID())
		}
		if m.Header("app") != "kept" {
			t.Errorf("%s: application header lost: %v", via, m.Headers)
		}
	}
}
