package telemetry

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/berthq/berth/sdk"
)

// Publisher is an [sdk.Publisher] that traces what it publishes and writes
// the trace context into the messages. Create it with [Observer.Publisher].
//
// For each message it fills an empty ID (a UUIDv7, as [sdk.Prepare] would)
// and an empty CorrelationID (from the context, see [sdk.WithCorrelationID],
// else a new one), starts the producer span, replaces Headers by a copy with
// "traceparent" (and "tracestate", "baggage" when set) added, then calls the
// wrapped Publisher. A single message gets a PRODUCER span "send <queue>"; a
// batch gets a PRODUCER span "create <queue>" per message (each message's
// creation context) and a CLIENT span "send <queue>" linked to all of them.
//
// Publish may be called concurrently, like the wrapped Publisher's. The
// wrapped broker's optional interfaces ([sdk.Inspector], [sdk.DeadLetters],
// …) are reached through [Publisher.Unwrap]: Publisher does not pretend to
// implement them.
type Publisher struct {
	obs  *Observer
	next sdk.Publisher
}

var _ sdk.Publisher = (*Publisher)(nil)

// Publisher returns p decorated with tracing, header propagation,
// correlation IDs and the sent-messages counter.
func (o *Observer) Publisher(p sdk.Publisher) *Publisher {
	return &Publisher{obs: o, next: p}
}

// Unwrap returns the wrapped Publisher.
func (p *Publisher) Unwrap() sdk.Publisher { return p.next }

// Publish traces and publishes msgs to queue. See [Publisher].
func (p *Publisher) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	o := p.obs
	for _, m := range msgs {
		if m == nil {
			return p.next.Publish(ctx, queue, msgs...) // the broker reports the invalid message
		}
	}
	system := o.systemOf(p.next)
	base := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(system),
		semconv.MessagingDestinationName(queue),
	}
	corr := sdk.CorrelationID(ctx)
	spans := make([]trace.Span, len(msgs))
	var batch trace.Span
	if len(msgs) == 1 {
		spans[0] = p.startMessage(ctx, msgs[0], corr, base, "send", semconv.MessagingOperationTypeSend)
	} else {
		links := make([]trace.Link, len(msgs))
		for i, m := range msgs {
			spans[i] = p.startMessage(ctx, m, corr, base, "create", semconv.MessagingOperationTypeCreate)
			links[i] = trace.Link{SpanContext: spans[i].SpanContext()}
		}
		attrs := append(append([]attribute.KeyValue(nil), base...),
			semconv.MessagingOperationName("send"),
			semconv.MessagingOperationTypeSend,
			semconv.MessagingBatchMessageCount(len(msgs)))
		_, batch = o.tracer.Start(ctx, "send "+queue,
			trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...), trace.WithLinks(links...))
	}

	err := p.next.Publish(ctx, queue, msgs...)

	var perr *sdk.PublishError
	partial := errors.As(err, &perr)
	failed := 0
	for i, s := range spans {
		merr := err
		if partial {
			merr = perr.Failed[msgs[i].ID]
		}
		if merr != nil {
			failed++
			s.RecordError(merr)
			s.SetStatus(codes.Error, "publish failed")
			s.SetAttributes(semconv.ErrorTypeKey.String(errorType(merr)))
		}
		s.End()
	}
	if batch != nil {
		if err != nil {
			batch.RecordError(err)
			batch.SetStatus(codes.Error, "publish failed")
			batch.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
		}
		batch.End()
	}
	if ok := len(msgs) - failed; ok > 0 {
		o.sent.Add(ctx, int64(ok), metric.WithAttributes(base...))
	}
	if failed > 0 {
		o.sent.Add(ctx, int64(failed), metric.WithAttributes(append(base, semconv.ErrorTypeKey.String(errorType(err)))...))
	}
	return err
}

func (p *Publisher) startMessage(ctx context.Context, m *sdk.Message, corr string, base []attribute.KeyValue,
	op string, opType attribute.KeyValue) trace.Span {
	if m.ID == "" {
		m.ID = sdk.NewID()
	}
	if m.CorrelationID == "" {
		m.CorrelationID = corr
		if m.CorrelationID == "" {
			m.CorrelationID = sdk.NewID()
		}
	}
	attrs := make([]attribute.KeyValue, 0, len(base)+6)
	attrs = append(attrs, base...)
	attrs = append(attrs,
		semconv.MessagingOperationName(op),
		opType,
		semconv.MessagingMessageID(m.ID),
		semconv.MessagingMessageConversationID(m.CorrelationID),
		semconv.MessagingMessageBodySize(len(m.Body)),
	)
	if m.Type != "" {
		attrs = append(attrs, AttrJobType.String(m.Type))
	}
	sctx, span := p.obs.tracer.Start(ctx, op+" "+queueOf(base), trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	Inject(sctx, p.obs.prop, m)
	return span
}

func queueOf(base []attribute.KeyValue) string { return base[1].Value.AsString() }

// errorType is the error.type of a publish failure: the berth sentinel it
// wraps, else "_OTHER" as the conventions ask.
func errorType(err error) string {
	for _, s := range []struct {
		err  error
		name string
	}{
		{sdk.ErrClosed, "closed"},
		{sdk.ErrInvalidQueue, "invalid_queue"},
		{sdk.ErrInvalidHeader, "invalid_header"},
		{sdk.ErrInvalidMessage, "invalid_message"},
		{sdk.ErrMessageTooLarge, "message_too_large"},
		{sdk.ErrUnavailable, "unavailable"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "timeout"},
	} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return "_OTHER"
}

// addEvent adds a span event to the span of ctx, if it records.
func addEvent(ctx context.Context, name string, attrs ...attribute.KeyValue) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}
