package telemetry

import (
	"context"
	"errors"
	"reflect"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/berthq/berth/sdk"
)

// deliveryCtx is the handler's context while a delivery runs: it carries the
// delivery's telemetry state itself, so starting a delivery costs one
// allocation for the state and the context value together.
type deliveryCtx struct {
	context.Context
	obs    *Observer
	span   trace.Span
	d      sdk.Delivery
	l      *labels
	active bool // in-flight counted
}

func (c *deliveryCtx) Value(key any) any {
	if k, ok := key.(ctxKey); ok && (k.o == nil || k.o == c.obs) {
		return c
	}
	return c.Context.Value(key)
}

// Span start options that never change, made once: each With… call allocates.
var (
	consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)
	producerKind = trace.WithSpanKind(trace.SpanKindProducer)
	clientKind   = trace.WithSpanKind(trace.SpanKindClient)
	newRoot      = trace.WithNewRoot()
)

// stateFrom returns the innermost delivery state in ctx, of any Observer.
func stateFrom(ctx context.Context) *deliveryCtx {
	st, _ := ctx.Value(ctxKey{}).(*deliveryCtx)
	return st
}

// stateOf returns o's delivery state in ctx: two Observers on one Worker
// each find their own.
func (o *Observer) stateOf(ctx context.Context) *deliveryCtx {
	st, _ := ctx.Value(ctxKey{o: o}).(*deliveryCtx)
	return st
}

// Start implements [sdk.Observer]: it extracts the trace context and baggage
// from the message's headers, starts the CONSUMER "process <queue>" span,
// puts the message's correlation ID in the context (when the Worker has not),
// and counts the delivery.
func (o *Observer) Start(ctx context.Context, d sdk.Delivery) context.Context {
	m := d.Message()
	base := labelKey{system: o.systemOf(d), queue: d.Queue(), jobType: m.Type}
	l := o.labelsFor(base)

	parent := Extract(ctx, o.prop, m)
	var creation trace.SpanContext // invalid when the message carried no trace context
	if parent != ctx {
		creation = trace.SpanContextFromContext(parent)
		if creation.Equal(trace.SpanContextFromContext(ctx)) {
			creation = trace.SpanContext{}
		}
	}
	st := &deliveryCtx{obs: o, d: d, l: l, active: true}
	if o.noopTracer {
		// What the no-op tracer's Start returns, without building the
		// span's attributes: the context as it is (a message's span
		// context stays the current one, non-recording) and a span that
		// does nothing.
		ctx, st.span = parent, noSpan
	} else {
		ctx, st.span = o.startProcess(parent, m, d, l, creation)
	}

	id := m.CorrelationID
	if id == "" && o.corrHeader != "" {
		id = m.Header(o.corrHeader)
	}
	if id != "" && sdk.CorrelationID(ctx) != id {
		ctx = sdk.WithCorrelationID(ctx, id)
	}

	l.consumed.Add(1)
	l.inFlight.Add(1)
	if d.Attempt() > 1 {
		l.redeliveries.Add(1)
	}
	st.Context = ctx
	return st
}

// startProcess starts the CONSUMER span of delivery d under parent, linked
// to the message's creation span when it carried one.
func (o *Observer) startProcess(parent context.Context, m *sdk.Message, d sdk.Delivery, l *labels, creation trace.SpanContext) (context.Context, trace.Span) {
	buf := getStartBuf()
	defer startBufs.Put(buf) // the tracer copies what it keeps
	attrs := append(buf.attrs[:0], l.spanAttrs...)
	attrs = append(attrs, semconv.MessagingMessageID(validText(m.ID)), AttrAttempt.Int(d.Attempt()))
	if id := m.CorrelationID; id != "" {
		attrs = append(attrs, semconv.MessagingMessageConversationID(validText(id)))
	} else if id := m.Header(o.corrHeader); o.corrHeader != "" && id != "" {
		attrs = append(attrs, semconv.MessagingMessageConversationID(validText(id)))
	}
	opts := append(buf.opts[:0], consumerKind, buf.withAttributes(len(attrs)))
	if creation.IsValid() {
		buf.link[0] = trace.Link{SpanContext: creation}
		opts = append(opts, buf.withLinks())
	}
	if o.linkOnly || !creation.IsValid() {
		// A new trace; the message's baggage stays in ctx. A message without
		// trace headers does not join whatever span the Worker's context has.
		opts = append(opts, newRoot)
	}
	return o.tracer.Start(parent, l.spanName, opts...)
}

// Settled implements [sdk.Observer]: it records the outcome on the process
// span and ends it, and records the delivery metrics.
//
// A settlement whose call failed (s.Err) is counted in
// berth.delivery.settlements under its action with
// berth.settlement.error_type (see [settleErrorType]), and not as a retry or
// dead letter: nothing was retried or dead-lettered, the broker delivers the
// job again. A delivery handed back because the Worker shuts down (the
// context's cause is [sdk.ErrShutdown]) is no handler error: it is counted as
// its release (or retry, where the broker cannot release) without
// error.type, in neither berth.job.errors nor berth.job.retries, and its span
// gets no error. Likewise a handler whose context the Worker cancelled
// because the delivery's lease was lost (the cause is [sdk.ErrLeaseLost];
// the delivery is not settled, another consumer may own it) did not fail,
// whatever it returned: it is counted as [sdk.ActionLeaseLost] in
// berth.delivery.settlements and berth.lease.expirations, its run time
// without error.type, not in berth.job.errors, and its span gets the status
// "lease lost" and no error.type or exception. An error a handler returned
// while its lease was held (one wrapping context.Canceled included) stays a
// handler error, also when the lease is lost while it is settled.
func (o *Observer) Settled(ctx context.Context, d sdk.Delivery, s sdk.Settlement) {
	shutdown := shutdownHandBack(ctx, s)
	if shutdown || leaseLostInterruption(ctx, s) {
		s.Cause, s.Class = nil, sdk.ClassNone
	}
	var lb *labels
	if st := o.stateOf(ctx); st != nil {
		lb = st.l
		if st.active { // Settled once per Start
			st.active = false
			lb.inFlight.Add(-1)
			o.recordSpan(st.span, s)
			st.span.End()
		}
	} else {
		lb = o.labelsFor(labelKey{system: o.systemOf(d), queue: d.Queue(), jobType: d.Message().Type})
	}

	class := s.Class
	if s.Cause == nil {
		class = sdk.ClassNone
	}
	settleClass := class
	if s.Action == sdk.ActionAck || s.Action == sdk.ActionLeaseLost {
		settleClass = sdk.ClassNone // an ack has no error; a lost lease's error is the cancellation
	}
	lb.outcome(s.Action, settleClass, settleErrorType(s.Err)).settled.Add(1)
	lc := lb
	if class != sdk.ClassNone {
		lc = lb.outcome("", class, "")
		lc.errors.Add(1)
	}
	if s.Duration > 0 {
		o.processDur.Record(ctx, s.Duration.Seconds(), lc.record...)
	}
	switch {
	case s.Err != nil || shutdown:
		// Not done (the call failed), or a shutdown's hand-back: no
		// successful ack, retry or dead letter to count.
	case s.Action == sdk.ActionAck:
		// From the Receive that claimed the delivery (prefetch wait included).
		// A settlement without Received (not from a Worker) falls back to the
		// start of handling, Duration before now: Start reads no clock for it.
		if !s.Received.IsZero() || s.Duration > 0 {
			since := s.Duration
			if !s.Received.IsZero() {
				since = time.Since(s.Received)
			}
			o.claimToAck.Record(ctx, since.Seconds(), lb.record...)
		}
	case s.Action == sdk.ActionRetry:
		lc.retries.Add(1)
		o.retryDelay.Record(ctx, s.Delay.Seconds(), lb.record...)
	case s.Action == sdk.ActionRelease:
		if s.Delay > 0 {
			o.retryDelay.Record(ctx, s.Delay.Seconds(), lb.record...)
		}
	case s.Action == sdk.ActionDeadLetter:
		lc.deadLetters.Add(1)
	}
	if s.Action == sdk.ActionLeaseLost || errors.Is(s.Err, sdk.ErrLeaseLost) {
		lb.leaseExp.Add(1)
	}
}

// shutdownHandBack reports whether s hands back a delivery whose handler the
// Worker's shutdown interrupted: a release (or a Retry where the delivery
// cannot be released) of a handler that returned an error while its
// context, ctx, was cancelled with cause [sdk.ErrShutdown] — the case the
// Worker settles so (ARCHITECTURE.md, Settlement).
func shutdownHandBack(ctx context.Context, s sdk.Settlement) bool {
	if s.Cause == nil || (s.Action != sdk.ActionRelease && s.Action != sdk.ActionRetry) || ctx.Err() == nil {
		return false
	}
	return errors.Is(context.Cause(ctx), sdk.ErrShutdown)
}

// leaseLostInterruption reports whether s reports a lost lease whose
// handler returned an error after the Worker cancelled its context, ctx,
// with cause [sdk.ErrLeaseLost]: the handler was interrupted, it did not
// fail (ARCHITECTURE.md, Settlement).
func leaseLostInterruption(ctx context.Context, s sdk.Settlement) bool {
	if s.Cause == nil || s.Action != sdk.ActionLeaseLost || ctx.Err() == nil {
		return false
	}
	return errors.Is(context.Cause(ctx), sdk.ErrLeaseLost)
}

// settleErrorType is the berth.settlement.error_type of a settlement call's
// error, "" for none: lease_lost, already_settled, or a publish's
// error.type values ([errorType]: closed, unavailable, canceled, timeout,
// _OTHER…), so that the label stays bounded whatever the broker answered.
func settleErrorType(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, sdk.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, sdk.ErrAlreadySettled):
		return "already_settled"
	}
	return errorType(err)
}

func (o *Observer) recordSpan(span trace.Span, s sdk.Settlement) {
	if !span.IsRecording() {
		return
	}
	buf := getStartBuf()
	defer startBufs.Put(buf) // SetAttributes copies
	attrs := append(buf.attrs[:0], AttrAction.String(string(s.Action)))
	if s.Class != sdk.ClassNone {
		attrs = append(attrs, semconv.ErrorTypeKey.String(string(s.Class)))
	}
	switch s.Action {
	case sdk.ActionRetry, sdk.ActionRelease:
		attrs = append(attrs, AttrRetryDelay.Float64(s.Delay.Seconds()))
	case sdk.ActionDeadLetter:
		reason := "dead-lettered"
		if s.Cause != nil {
			reason = s.Cause.Error()
		}
		attrs = append(attrs, AttrDeadLetterReason.String(sdk.SanitizeReason(reason)))
	}
	if s.Err != nil {
		attrs = append(attrs, AttrSettleError.String(sdk.SanitizeReason(s.Err.Error())))
	}
	span.SetAttributes(attrs...)
	switch {
	case s.Cause != nil && s.Action != sdk.ActionRelease:
		recordError(span, s.Cause)
		span.SetStatus(codes.Error, string(s.Class))
	case s.Err != nil:
		recordError(span, s.Err)
		span.SetStatus(codes.Error, "settlement failed")
	case s.Action == sdk.ActionLeaseLost:
		span.SetStatus(codes.Error, "lease lost")
	}
}

// recordError is span.RecordError with the message made valid UTF-8 and
// bounded by [sdk.SanitizeReason], as a dead-letter reason is: an error's
// text may quote a message or a server's answer, carry any bytes and be of
// any length. The event is the one RecordError adds ("exception", with
// exception.type and exception.message).
func recordError(span trace.Span, err error) {
	if err == nil || !span.IsRecording() {
		return
	}
	span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(
		semconv.ExceptionType(errorTypeName(err)),
		semconv.ExceptionMessage(sdk.SanitizeReason(err.Error())),
	))
}

// errorTypeName names err's type as the OpenTelemetry SDK's RecordError does.
func errorTypeName(err error) string {
	t := reflect.TypeOf(err)
	if t.PkgPath() == "" && t.Name() == "" {
		return t.String() // a pointer or another unnamed type
	}
	return t.PkgPath() + "." + t.Name()
}

// LeaseExtended implements [sdk.LeaseObserver]: it counts lease extensions,
// successful or not.
func (o *Observer) LeaseExtended(ctx context.Context, d sdk.Delivery, by time.Duration, err error) {
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(o.systemOf(d)),
		semconv.MessagingDestinationName(d.Queue()),
		AttrJobType.String(o.jobLabel(d.Message().Type)),
		AttrLeaseResult.String("ok"),
	}
	if err != nil {
		attrs[3] = AttrLeaseResult.String("failed")
		attrs = append(attrs, semconv.ErrorTypeKey.String(string(sdk.Classify(err))))
	}
	o.leaseExt.Add(ctx, 1, metric.WithAttributes(attrs...))
}
