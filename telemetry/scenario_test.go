package telemetry_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// discard is a logger for Workers whose logs the test does not read.
var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func uniqueQueue(t testing.TB, prefix string) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return prefix + "_" + hex.EncodeToString(b[:])
}

// declare declares queue on b when b can.
func declare(t testing.TB, b sdk.Broker, queue string) {
	t.Helper()
	if d, ok := b.(sdk.QueueDeclarer); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := d.DeclareQueue(ctx, queue); err != nil {
			t.Fatalf("declare %s: %v", queue, err)
		}
	}
}

// newTracing returns a tracer provider recording every span.
func newTracing(t testing.TB) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

// newObserver returns an Observer over tp and a fresh meter provider reading
// into the returned ManualReader.
func newObserver(t testing.TB, tp trace.TracerProvider, opts telemetry.Options) (*telemetry.Observer, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	opts.TracerProvider = tp
	opts.MeterProvider = mp
	obs, err := telemetry.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = obs.Close() })
	return obs, reader
}

// runWorker runs a Worker until stop is called, which returns once Run has
// returned.
func runWorker(t testing.TB, sub sdk.Subscriber, h sdk.Handler, opts sdk.WorkerOptions) (stop func()) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = discard
	}
	w, err := sdk.NewWorker(sub, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// eventually polls cond until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// traceScenario publishes one job through the telemetry publisher on b,
// consumes it with a Worker whose handler always fails transiently, with
// MaxAttempts 2, so the job is retried once and then dead-lettered, and
// checks that the whole flow is one trace: the caller's span, the PRODUCER
// "send" span under it, and one CONSUMER "process" span per attempt, each a
// child of and linked to the send span, with the messaging and berth
// attributes. queue must be fresh; b is not closed.
func traceScenario(t *testing.T, b sdk.Broker, queue string) {
	t.Helper()
	tp, rec := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{})
	declare(t, b, queue)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ctx, root := tp.Tracer("test").Start(ctx, "checkout")
	m := &sdk.Message{Type: "billing.charge", IdempotencyKey: "charge:order_123:v1", Body: []byte(`{"order":"order_123"}`)}
	if err := obs.Publisher(b).Publish(ctx, queue, m); err != nil {
		t.Fatalf("publish: %v", err)
	}
	root.End()
	if m.ID == "" || m.CorrelationID == "" {
		t.Fatalf("publish left ID %q or CorrelationID %q empty", m.ID, m.CorrelationID)
	}

	cause := errors.New("card network down")
	stop := runWorker(t, b, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return cause }), sdk.WorkerOptions{
		Queue:       queue,
		Concurrency: 1,
		Retry:       sdk.RetryPolicy{MaxAttempts: 2, Backoff: sdk.Backoff{Base: 50 * time.Millisecond, Max: 50 * time.Millisecond, Jitter: -1}},
		Observers:   []sdk.Observer{obs},
	})
	processName := "process " + queue
	eventually(t, 45*time.Second, "two process spans", func() bool { return len(spansNamed(rec, processName)) >= 2 })
	stop()

	sends := spansNamed(rec, "send "+queue)
	if len(sends) != 1 {
		t.Fatalf("got %d send spans, want 1", len(sends))
	}
	send := sends[0]
	traceID := root.SpanContext().TraceID()
	if send.SpanKind() != trace.SpanKindProducer {
		t.Errorf("send span kind %v, want producer", send.SpanKind())
	}
	if send.SpanContext().TraceID() != traceID || send.Parent().SpanID() != root.SpanContext().SpanID() {
		t.Errorf("send span is not a child of the caller's span")
	}
	sa := attrsOf(send)
	for k, want := range map[attribute.Key]string{
		"messaging.operation.name":          "send",
		"messaging.operation.type":          "send",
		"messaging.destination.name":        queue,
		"messaging.message.id":              m.ID,
		"messaging.message.conversation_id": m.CorrelationID,
		"berth.job.type":                    "billing.charge",
	} {
		if got := sa[k].AsString(); got != want {
			t.Errorf("send span %s = %q, want %q", k, got, want)
		}
	}
	if sa["messaging.system"].AsString() == "" {
		t.Error("send span has no messaging.system")
	}

	procs := spansNamed(rec, processName)
	if len(procs) != 2 {
		t.Fatalf("got %d process spans, want 2 (one retry, one dead letter)", len(procs))
	}
	sort.Slice(procs, func(i, j int) bool {
		return attrsOf(procs[i])["berth.delivery.attempt"].AsInt64() < attrsOf(procs[j])["berth.delivery.attempt"].AsInt64()
	})
	for i, p := range procs {
		a := attrsOf(p)
		if p.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("process span %d kind %v, want consumer", i, p.SpanKind())
		}
		if p.SpanContext().TraceID() != traceID {
			t.Errorf("process span %d is in trace %s, want %s", i, p.SpanContext().TraceID(), traceID)
		}
		if p.Parent().SpanID() != send.SpanContext().SpanID() {
			t.Errorf("process span %d parent %s, want the send span %s", i, p.Parent().SpanID(), send.SpanContext().SpanID())
		}
		if ls := p.Links(); len(ls) != 1 || ls[0].SpanContext.SpanID() != send.SpanContext().SpanID() {
			t.Errorf("process span %d links %v, want one link to the send span", i, ls)
		}
		for k, want := range map[attribute.Key]string{
			"messaging.operation.name":          "process",
			"messaging.operation.type":          "process",
			"messaging.destination.name":        queue,
			"messaging.message.id":              m.ID,
			"messaging.message.conversation_id": m.CorrelationID,
			"messaging.system":                  sa["messaging.system"].AsString(),
			"berth.job.type":                    "billing.charge",
			"error.type":                        string(sdk.ClassTransient),
		} {
			if got := a[k].AsString(); got != want {
				t.Errorf("process span %d %s = %q, want %q", i, k, got, want)
			}
		}
		if got := a["berth.delivery.attempt"].AsInt64(); got != int64(i+1) {
			t.Errorf("process span %d attempt %d, want %d", i, got, i+1)
		}
		if p.Status().Code != codes.Error {
			t.Errorf("process span %d status %v, want error", i, p.Status())
		}
	}
	first, last := attrsOf(procs[0]), attrsOf(procs[1])
	if got := first["berth.settlement.action"].AsString(); got != string(sdk.ActionRetry) {
		t.Errorf("attempt 1 action %q, want retry", got)
	}
	if got := first["berth.retry.delay"].AsFloat64(); got != 0.05 {
		t.Errorf("attempt 1 retry delay %v s, want 0.05", got)
	}
	if got := last["berth.settlement.action"].AsString(); got != string(sdk.ActionDeadLetter) {
		t.Errorf("attempt 2 action %q, want dead_letter", got)
	}
	if got := last["berth.dead_letter.reason"].AsString(); got != cause.Error() {
		t.Errorf("dead-letter reason %q, want %q", got, cause.Error())
	}

	// The dead letter still carries the creation context, so a redrive
	// continues the same trace.
	if dl, ok := b.(sdk.DeadLetters); ok {
		var got *sdk.Message
		eventually(t, 20*time.Second, "the dead letter", func() bool {
			msgs, err := dl.ListDeadLetters(ctx, queue, 10)
			if err == nil && len(msgs) == 1 {
				got = msgs[0]
			}
			return got != nil
		})
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(got.Headers)))
		if sc.SpanID() != send.SpanContext().SpanID() || sc.TraceID() != traceID {
			t.Errorf("dead letter traceparent %q does not name the send span", got.Header("traceparent"))
		}
	}
}
