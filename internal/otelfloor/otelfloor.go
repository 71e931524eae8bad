// Package otelfloor is the floor under berth's telemetry benchmarks: what an
// application that wants the same two spans per message as berth's
// telemetry writes by hand with the OpenTelemetry SDK and nothing of
// berth's ([HandTraced]), and the same for the two histograms berth records
// per delivery ([HandMetered]). telemetry's BenchmarkWorker and the
// benchmarks module's telemetry scenario both measure them, so that
// "on − floor" and "metrics − metrics floor" are berth's own cost in both.
package otelfloor

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/berthq/berth/sdk"
)

// HandTraced publishes through Next with a PRODUCER span per message (the
// same 7 attributes as berth's) and the W3C trace context injected into its
// headers, and, as an [sdk.Observer], opens on the consumer side a CONSUMER
// span child of the producer's and linked to it (the same 8 attributes),
// sets the settlement action and ends it. No metrics.
type HandTraced struct {
	Tracer        trace.Tracer
	Next          sdk.Publisher
	Send, Process string // span names, made once
}

var (
	prop     = propagation.TraceContext{}
	producer = trace.WithSpanKind(trace.SpanKindProducer)
	consumer = trace.WithSpanKind(trace.SpanKindConsumer)
)

// New returns the floor for queue: spans named "send <queue>" and
// "process <queue>".
func New(tr trace.Tracer, next sdk.Publisher, queue string) HandTraced {
	return HandTraced{Tracer: tr, Next: next, Send: "send " + queue, Process: "process " + queue}
}

// Publish records a PRODUCER span per message, injects its context into the
// message's headers, and publishes through Next.
func (h HandTraced) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	for _, m := range msgs {
		if m.ID == "" {
			m.ID = sdk.NewID()
		}
		if m.CorrelationID == "" {
			m.CorrelationID = m.ID
		}
		sctx, span := h.Tracer.Start(ctx, h.Send, producer, trace.WithAttributes(
			attribute.String("messaging.system", "memory"), attribute.String("messaging.destination.name", queue),
			attribute.String("messaging.operation.name", "send"), attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.message.id", m.ID), attribute.String("messaging.message.conversation_id", m.CorrelationID),
			attribute.String("berth.job.type", m.Type)))
		hdr := make(map[string]string, len(m.Headers)+1)
		for k, v := range m.Headers {
			hdr[k] = v
		}
		prop.Inject(sctx, propagation.MapCarrier(hdr))
		m.Headers = hdr
		span.End()
	}
	return h.Next.Publish(ctx, queue, msgs...)
}

// Start extracts the producer's context and starts the CONSUMER span.
func (h HandTraced) Start(ctx context.Context, d sdk.Delivery) context.Context {
	m := d.Message()
	pctx := prop.Extract(ctx, propagation.MapCarrier(m.Headers))
	ctx, _ = h.Tracer.Start(pctx, h.Process, consumer,
		trace.WithLinks(trace.Link{SpanContext: trace.SpanContextFromContext(pctx)}),
		trace.WithAttributes(
			attribute.String("messaging.system", "memory"), attribute.String("messaging.destination.name", d.Queue()),
			attribute.String("messaging.operation.name", "process"), attribute.String("messaging.operation.type", "process"),
			attribute.String("berth.job.type", m.Type), attribute.String("messaging.message.id", m.ID),
			attribute.Int("berth.delivery.attempt", d.Attempt()), attribute.String("messaging.message.conversation_id", m.CorrelationID)))
	return ctx
}

// Settled sets the settlement action on the CONSUMER span and ends it.
func (h HandTraced) Settled(ctx context.Context, _ sdk.Delivery, s sdk.Settlement) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.String("berth.settlement.action", string(s.Action)))
	span.End()
}

// DurationBuckets are the histogram boundaries, in seconds, of berth's
// duration histograms (telemetry checks that they stay the same).
var DurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60, 300}

// HandMetered is the floor under berth's metrics: an [sdk.Observer] that
// records, with the OpenTelemetry SDK and nothing of berth's, the two
// histograms berth's telemetry records per acked delivery
// (messaging.process.duration and berth.delivery.claim_to_ack.duration,
// with the same boundaries) under one attribute set made once (the same
// three attributes: messaging.system, messaging.destination.name,
// berth.job.type). It counts nothing and propagates nothing: what is left
// of berth's metrics above it (its counters, labels, header propagation,
// the delivery state) is berth's own cost.
type HandMetered struct {
	process, claimToAck metric.Float64Histogram
	attrs               []metric.RecordOption // a slice made once: a variadic argument list would allocate per call
}

// NewMetered returns the metrics floor for deliveries of jobType from queue
// on the memory broker, its instruments made with mp.
func NewMetered(mp metric.MeterProvider, queue, jobType string) (HandMetered, error) {
	m := mp.Meter("floor")
	p, err := m.Float64Histogram("messaging.process.duration", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(DurationBuckets...))
	if err != nil {
		return HandMetered{}, err
	}
	c, err := m.Float64Histogram("berth.delivery.claim_to_ack.duration", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(DurationBuckets...))
	if err != nil {
		return HandMetered{}, err
	}
	set := attribute.NewSet(attribute.String("messaging.system", "memory"), attribute.String("messaging.destination.name", queue), attribute.String("berth.job.type", jobType))
	return HandMetered{process: p, claimToAck: c, attrs: []metric.RecordOption{metric.WithAttributeSet(set)}}, nil
}

// Start returns ctx: the floor keeps no state per delivery.
func (h HandMetered) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

// Settled records an acked delivery's handler time and its time from the
// receive that claimed it.
func (h HandMetered) Settled(ctx context.Context, _ sdk.Delivery, s sdk.Settlement) {
	if s.Action != sdk.ActionAck || s.Err != nil {
		return
	}
	h.process.Record(ctx, s.Duration.Seconds(), h.attrs...)
	h.claimToAck.Record(ctx, time.Since(s.Received).Seconds(), h.attrs...)
}
