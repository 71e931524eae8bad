package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// points returns the attribute sets of metric name's int64 sum data points
// whose attributes include want, with their values.
func points(t *testing.T, ms metrics, name string, want ...attribute.KeyValue) map[attribute.Set]int64 {
	t.Helper()
	out := map[attribute.Set]int64{}
	m, ok := ms.find(name)
	if !ok {
		return out
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is a %T", name, m.Data)
	}
	for _, p := range sum.DataPoints {
		if matches(p.Attributes, want) {
			out[p.Attributes] += p.Value
		}
	}
	return out
}

// TestFailedSettlementCountedAsFailed: a settlement whose call failed (an ack
// refused because the lease was lost, a dead letter the broker did not take)
// is counted in berth.delivery.settlements with its action and a bounded
// berth.settlement.error_type, never as an action that happened; a failed
// dead letter or retry is no dead letter or retry. A settlement that worked
// carries no berth.settlement.error_type.
func TestFailedSettlementCountedAsFailed(t *testing.T) {
	obs, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{})
	ctx := context.Background()
	settle := func(s sdk.Settlement) {
		d := berthtest.NewDelivery(&sdk.Message{ID: "m", Type: "t"})
		obs.Settled(obs.Start(ctx, d), d, s)
	}
	permanent := sdk.Permanent(errors.New("bad row"))
	transient := errors.New("flaky")
	settle(sdk.Settlement{Action: sdk.ActionAck})
	settle(sdk.Settlement{Action: sdk.ActionAck, Err: fmt.Errorf("ack: %w", sdk.ErrLeaseLost)})
	settle(sdk.Settlement{Action: sdk.ActionDeadLetter, Cause: permanent, Class: sdk.ClassPermanent,
		Err: fmt.Errorf("dead letter: %w", sdk.ErrUnavailable)})
	settle(sdk.Settlement{Action: sdk.ActionRetry, Delay: time.Second, Cause: transient, Class: sdk.ClassTransient,
		Err: errors.New("connection reset")})

	ms := collect(t, reader)
	const name = "berth.delivery.settlements"
	action := func(a sdk.Action) attribute.KeyValue { return telemetry.AttrAction.String(string(a)) }
	for set, n := range points(t, ms, name, action(sdk.ActionAck)) {
		v, failed := set.Value(telemetry.AttrSettleErrorType)
		switch {
		case !failed && n != 1:
			t.Errorf("acks that worked: %d, want 1", n)
		case failed && (v.AsString() != "lease_lost" || n != 1):
			t.Errorf("failed acks: %d with %s %q, want 1 with lease_lost", n, telemetry.AttrSettleErrorType, v.AsString())
		}
	}
	if got := ms.sum(name, action(sdk.ActionAck), telemetry.AttrSettleErrorType.String("lease_lost")); got != 1 {
		t.Errorf("acks refused for a lost lease: %v, want 1", got)
	}
	if got := ms.sum(name, action(sdk.ActionDeadLetter), telemetry.AttrSettleErrorType.String("unavailable")); got != 1 {
		t.Errorf("dead letters the broker did not take: %v, want 1", got)
	}
	if got := ms.sum(name, action(sdk.ActionRetry), telemetry.AttrSettleErrorType.String("_OTHER")); got != 1 {
		t.Errorf("retries that failed otherwise: %v, want 1", got)
	}
	if got := ms.sum("berth.job.dead_letters"); got != 0 {
		t.Errorf("berth.job.dead_letters %v after a failed dead letter, want 0", got)
	}
	if got := ms.sum("berth.job.retries"); got != 0 {
		t.Errorf("berth.job.retries %v after a failed retry, want 0", got)
	}
	if got := ms.sum("berth.job.errors"); got != 2 {
		t.Errorf("berth.job.errors %v, want 2 (the handlers did fail)", got)
	}
}

// TestShutdownReleaseIsNoHandlerError: a handler interrupted by the Worker's
// shutdown (context cause sdk.ErrShutdown) that returns its context's error
// is released; that is no handler error: berth.job.errors stays 0, the
// settlement is counted as a release without error.type, and the process
// span has no error status or error.type.
func TestShutdownReleaseIsNoHandlerError(t *testing.T) {
	tp, rec := newTracing(t)
	obs, reader := newObserver(t, tp, telemetry.Options{})
	b := newMemory(t)
	queue := uniqueQueue(t, "sd")
	ctx := context.Background()
	if err := obs.Publisher(b).Publish(ctx, queue, &sdk.Message{Type: "report.build"}); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	var cause error
	stop := runWorker(t, b, sdk.HandlerFunc(func(ctx context.Context, _ sdk.Delivery) error {
		close(started)
		<-ctx.Done()
		cause = context.Cause(ctx)
		return ctx.Err()
	}), sdk.WorkerOptions{Queue: queue, Concurrency: 1, DrainTimeout: time.Millisecond, Observers: []sdk.Observer{obs}})
	<-started
	stop()
	if !errors.Is(cause, sdk.ErrShutdown) {
		t.Fatalf("handler context cause %v, want ErrShutdown", cause)
	}

	ms := collect(t, reader)
	if got := ms.sum("berth.job.errors"); got != 0 {
		t.Errorf("berth.job.errors %v after a shutdown, want 0", got)
	}
	rel := points(t, ms, "berth.delivery.settlements", telemetry.AttrAction.String(string(sdk.ActionRelease)))
	if len(rel) != 1 {
		t.Fatalf("release settlements %v, want one point", rel)
	}
	for set, n := range rel {
		if v, ok := set.Value("error.type"); ok || n != 1 {
			t.Errorf("release settlements: %d with error.type %q, want 1 without", n, v.AsString())
		}
	}
	spans := spansNamed(rec, "process "+queue)
	if len(spans) != 1 {
		t.Fatalf("%d process spans, want 1", len(spans))
	}
	if s := spans[0]; s.Status().Code == codes.Error || attrsOf(s)["error.type"].AsString() != "" {
		t.Errorf("shutdown span: status %v, error.type %q; want no error", s.Status(), attrsOf(s)["error.type"].AsString())
	}
}

// TestShutdownRetryIsNoHandlerError: where the delivery cannot be released
// (SQS), the shutdown hands it back with Retry(0), reported as ActionRetry:
// still no handler error, no retry counted, no error status on the span.
func TestShutdownRetryIsNoHandlerError(t *testing.T) {
	tp, rec := newTracing(t)
	obs, reader := newObserver(t, tp, telemetry.Options{})
	base, cancel := context.WithCancelCause(context.Background())
	d := berthtest.NewDelivery(&sdk.Message{ID: "m", Type: "t"})
	hctx := obs.Start(base, d)
	cancel(sdk.ErrShutdown)
	obs.Settled(hctx, d, sdk.Settlement{Action: sdk.ActionRetry, Cause: hctx.Err(), Class: sdk.Classify(hctx.Err())})

	ms := collect(t, reader)
	for _, name := range []string{"berth.job.errors", "berth.job.retries"} {
		if got := ms.sum(name); got != 0 {
			t.Errorf("%s %v after a shutdown, want 0", name, got)
		}
	}
	if got := ms.sum("berth.delivery.settlements", telemetry.AttrAction.String(string(sdk.ActionRetry))); got != 1 {
		t.Errorf("retry settlements %v, want 1", got)
	}
	for _, s := range rec.Ended() {
		if s.Status().Code == codes.Error {
			t.Errorf("span %s: status %v after a shutdown, want no error", s.Name(), s.Status())
		}
	}
}

// TestNewRejectsBadCorrelationHeader: a CorrelationHeader every publish
// would fail on (a reserved berth- name, an invalid one) or that would
// overwrite the trace headers is refused by New with a *sdk.HeaderError.
func TestNewRejectsBadCorrelationHeader(t *testing.T) {
	for _, h := range []string{"berth-correlation", "BERTH-X", "\xff", "traceparent", "Baggage"} {
		_, err := telemetry.New(telemetry.Options{MeterProvider: noopMeter(), TracerProvider: noop.NewTracerProvider(), CorrelationHeader: h})
		var he *sdk.HeaderError
		if !errors.Is(err, sdk.ErrInvalidHeader) || !errors.As(err, &he) {
			t.Errorf("CorrelationHeader %q: err %v, want a *sdk.HeaderError", h, err)
		}
	}
	obs, err := telemetry.New(telemetry.Options{MeterProvider: noopMeter(), CorrelationHeader: "x-correlation-id"})
	if err != nil {
		t.Fatalf("x-correlation-id refused: %v", err)
	}
	_ = obs.Close()
}

// TestSameObserverTwiceRefused: an Observer listed twice in
// WorkerOptions.Observers would start two process spans and count the
// delivery in flight twice, and end and uncount it once: NewWorker refuses
// the options.
func TestSameObserverTwiceRefused(t *testing.T) {
	obs, _ := newObserver(t, noop.NewTracerProvider(), telemetry.Options{})
	b := newMemory(t)
	rec := berthtest.NewRecorder()
	_, err := sdk.NewWorker(b, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "q", Observers: []sdk.Observer{obs, rec, obs}, Logger: discard})
	if !errors.Is(err, sdk.ErrInvalidOptions) {
		t.Errorf("an Observer listed twice: err %v, want ErrInvalidOptions", err)
	}
}

// TestPublishNothingStartsNoSpan: publishing no message starts no span.
func TestPublishNothingStartsNoSpan(t *testing.T) {
	tp, rec := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{})
	b := newMemory(t)
	queue := uniqueQueue(t, "pz")
	_ = obs.Publisher(b).Publish(context.Background(), queue)
	if n := len(rec.Started()); n != 0 {
		t.Errorf("%d spans for a publish of nothing, want 0", n)
	}
}

func noopMeter() metric.MeterProvider { return metricnoop.NewMeterProvider() }
