package telemetry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/berthq/berth/sdk"
)

// Publisher returns p decorated with tracing, header propagation,
// correlation IDs and the sent-messages counter.
//
// For each message the returned publisher fills an empty ID (a UUIDv7, as
// [sdk.Prepare] would) and an empty CorrelationID (from the context, see
// [sdk.WithCorrelationID], else the message's own ID, as sdk.Prepare does,
// which also replaces an inherited ID that is not valid UTF-8 by a text one),
// starts the producer span, replaces Headers by a copy with "traceparent"
// (and "tracestate", "baggage" when set) added, and the "tracestate" of the
// trace context the message carried before removed — when the propagator
// writes nothing (a no-op tracer, no baggage) Headers are left as they are —
// then calls p. A single message gets a PRODUCER span "send <queue>"; a
// batch gets a PRODUCER span "create <queue>" per message (each message's
// creation context) and a CLIENT span "send <queue>" linked to all of them.
//
// Published outside any span, a message that already carries a trace
// context in its headers (put there by [Inject] when an outbox row was
// written, for instance) gets its send span under that context, so the
// trace continues across the outbox.
//
// When p is an [sdk.AsyncPublisher] (RabbitMQ, JetStream, an
// [sdk.AsyncPool]), so is the returned publisher, and only then: the outbox
// relay and [sdk.NewAsyncPublisher] keep using the broker's own asynchronous
// publish through it. Its PublishAsync gives each message the PRODUCER span
// "send <queue>" and the headers of a single-message Publish before handing
// it to p; the span ends, with the error recorded when the broker failed the
// message, and the message is counted, when the broker confirms or fails it,
// before the result PublishAsync returned resolves (a message p refuses at
// once is recorded then). That is done on the broker's confirming goroutine,
// without a goroutine per message and without waiting: the span ends there,
// so export spans with a batching span processor (sdktrace.WithBatcher, as
// in production), not a synchronous one.
//
// The returned publisher may be called concurrently, like p. p's optional
// interfaces ([sdk.Inspector], [sdk.DeadLetters], …) are reached through its
// Unwrap() sdk.Publisher method, which returns p: it does not pretend to
// implement them.
func (o *Observer) Publisher(p sdk.Publisher) sdk.Publisher {
	pub := &publisher{obs: o, next: p}
	if ap, ok := p.(sdk.AsyncPublisher); ok {
		return &asyncPublisher{publisher: pub, ap: ap}
	}
	return pub
}

// publisher is the publisher [Observer.Publisher] returns.
type publisher struct {
	obs  *Observer
	next sdk.Publisher
}

// Unwrap returns the wrapped Publisher.
func (p *publisher) Unwrap() sdk.Publisher { return p.next }

// Publish traces and publishes msgs to queue. See [Observer.Publisher].
func (p *publisher) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	return p.obs.publish(ctx, p.next, queue, msgs, func() error { return p.next.Publish(ctx, queue, msgs...) })
}

// asyncPublisher is the publisher of a broker that publishes
// asynchronously: it keeps that capability visible (see
// [Observer.Publisher]).
type asyncPublisher struct {
	*publisher
	ap sdk.AsyncPublisher
}

// PublishAsync traces msg and publishes it through the broker's
// PublishAsync; its span ends when the broker confirms or fails it, before
// the result returned resolves with the broker's outcome.
func (p *asyncPublisher) PublishAsync(ctx context.Context, queue string, msg *sdk.Message) (*sdk.PublishResult, error) {
	if msg == nil {
		return p.ap.PublishAsync(ctx, queue, msg) // the broker reports the invalid message
	}
	pl := p.obs.publishLabels(labelKey{system: p.obs.systemOf(p.next), queue: queue})
	span := p.obs.startMessage(ctx, msg, sdk.CorrelationID(ctx), pl, false)
	res, err := p.ap.PublishAsync(ctx, queue, msg)
	if err != nil || res == nil {
		endSend(span, pl, err)
		return res, err
	}
	out := sdk.NewPublishResult(res.ID())
	res.AfterResolve(func(err error) {
		// On the broker's confirming goroutine: nothing here waits.
		endSend(span, pl, err)
		out.Resolve(err)
	})
	return out, nil
}

// endSend ends the send span of one message with the outcome of its
// publish, err, and counts the message.
func endSend(span trace.Span, pl *pubLabels, err error) {
	failed := 0
	if err != nil {
		failed = 1
		recordPublishError(span, err)
	}
	span.End()
	pl.count(1, failed, err)
}

// publish traces and counts the publishing of msgs to queue by send, which
// target (a Publisher, a TxPublisher) does: the spans and headers of
// [Observer.Publisher], the sent-messages counter under target's
// messaging.system.
//
// Publishing no message starts no span and counts nothing: send is called
// as it is, for the broker's answer.
func (o *Observer) publish(ctx context.Context, target any, queue string, msgs []*sdk.Message, send func() error) error {
	if len(msgs) == 0 {
		return send()
	}
	for _, m := range msgs {
		if m == nil {
			return send() // the broker reports the invalid message
		}
	}
	pl := o.publishLabels(labelKey{system: o.systemOf(target), queue: queue})
	corr := sdk.CorrelationID(ctx)
	if len(msgs) == 1 {
		span := o.startMessage(ctx, msgs[0], corr, pl, false)
		err := send()
		endSend(span, pl, err)
		return err
	}
	spans := make([]trace.Span, len(msgs))
	links := make([]trace.Link, len(msgs))
	for i, m := range msgs {
		spans[i] = o.startMessage(ctx, m, corr, pl, true)
		links[i] = trace.Link{SpanContext: spans[i].SpanContext()}
	}
	_, batch := o.tracer.Start(ctx, pl.sendName,
		clientKind,
		trace.WithAttributes(append(pl.sendAttrs[:len(pl.sendAttrs):len(pl.sendAttrs)], semconv.MessagingBatchMessageCount(len(msgs)))...),
		trace.WithLinks(links...))

	err := send()

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
			recordPublishError(s, merr)
			if partial { // each failed message under its own error.type
				pl.failedFor(errorType(merr)).sent.Add(1)
			}
		}
		s.End()
	}
	if err != nil {
		recordPublishError(batch, err)
	}
	batch.End()
	if partial {
		pl.count(len(msgs)-failed, 0, nil)
	} else {
		pl.count(len(msgs), failed, err)
	}
	return err
}

func recordPublishError(span trace.Span, err error) {
	recordError(span, err)
	span.SetStatus(codes.Error, "publish failed")
	span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
}

// count adds the sent messages, the failed ones under their error.type.
func (pl *pubLabels) count(n, failed int, err error) {
	if ok := n - failed; ok > 0 {
		pl.sent.Add(int64(ok))
	}
	if failed > 0 {
		pl.failedFor(errorType(err)).sent.Add(int64(failed))
	}
}

// pubLabels caches what publishing to one queue of one system needs.
type pubLabels struct {
	labels
	sent                   atomic.Int64
	sendName, createName   string
	sendAttrs, createAttrs []attribute.KeyValue
	failed                 map[string]*sentLabels // by error.type; guarded by mu
}

// sentLabels counts failed publishes of one error.type.
type sentLabels struct {
	labels
	sent atomic.Int64
}

func (pl *pubLabels) failedFor(errType string) *sentLabels {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if f, ok := pl.failed[errType]; ok {
		return f
	}
	opt := metric.WithAttributeSet(attribute.NewSet(pl.sendAttrs[0], pl.sendAttrs[1], semconv.ErrorTypeKey.String(errType)))
	f := &sentLabels{labels: labels{observe: []metric.ObserveOption{opt}}}
	pl.failed[errType] = f
	return f
}

func (o *Observer) publishLabels(k labelKey) *pubLabels {
	if last := o.lastPub.Load(); last != nil && last.key == k { // a publisher mostly sends to one queue
		return last.l
	}
	l := o.lookupPublishLabels(k)
	o.lastPub.Store(&pubLabelsEntry{k, l})
	return l
}

// pubLabelsEntry is publishLabels' one-entry cache.
type pubLabelsEntry struct {
	key labelKey // as asked
	l   *pubLabels
}

func (o *Observer) lookupPublishLabels(k labelKey) *pubLabels {
	o.mu.RLock()
	l, ok := o.pubLabels[k]
	o.mu.RUnlock()
	if ok {
		return l
	}
	if sdk.ValidateQueueName(k.queue) != nil {
		// The broker will refuse the publish: one label set for every bad
		// name, so that they cannot grow the cache (or a metric backend).
		k.queue = invalidQueue
		o.mu.RLock()
		l, ok = o.pubLabels[k]
		o.mu.RUnlock()
		if ok {
			return l
		}
	}
	sys, dest := semconv.MessagingSystemKey.String(k.system), semconv.MessagingDestinationName(k.queue)
	l = &pubLabels{
		labels:      labels{observe: []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(sys, dest))}},
		failed:      make(map[string]*sentLabels),
		sendName:    "send " + k.queue,
		createName:  "create " + k.queue,
		sendAttrs:   []attribute.KeyValue{sys, dest, semconv.MessagingOperationName("send"), semconv.MessagingOperationTypeSend},
		createAttrs: []attribute.KeyValue{sys, dest, semconv.MessagingOperationName("create"), semconv.MessagingOperationTypeCreate},
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if prev, ok := o.pubLabels[k]; ok {
		return prev
	}
	o.pubLabels[k] = l
	return l
}

func (o *Observer) startMessage(ctx context.Context, m *sdk.Message, corr string, pl *pubLabels, create bool) trace.Span {
	if m.ID == "" {
		m.ID = sdk.NewID()
	}
	if m.CorrelationID == "" {
		m.CorrelationID = inheritedCorrelationID(corr)
		if m.CorrelationID == "" {
			// A message published outside any flow starts one: its own ID
			// names the conversation, as sdk.Prepare does.
			m.CorrelationID = m.ID
		}
	}
	buf := getStartBuf()
	defer startBufs.Put(buf) // the SDK copies the attributes it keeps
	parent := ctx
	if len(m.Headers) > 0 && !trace.SpanContextFromContext(ctx).IsValid() {
		// A message that already carries a trace context (written with
		// Inject into an outbox row, say) and is published outside any span
		// continues that trace.
		parent = Extract(ctx, o.prop, m)
	}
	sctx, span := parent, noSpan // what the no-op tracer's Start would return
	if !o.noopTracer {
		sctx, span = o.startSend(parent, m, pl, create, buf)
	}
	c := &buf.carrier
	o.prop.Inject(sctx, c)
	if h := o.corrHeader; h != "" {
		c.Set(h, m.CorrelationID)
	}
	// Headers are copied only when there is something to write (not with
	// a no-op tracer and no baggage), so that the broker need not copy an
	// empty map.
	m.Headers = c.merge(m.Headers, false)
	return span
}

// inheritedCorrelationID returns corr, the correlation ID of the publishing
// context, as [sdk.Prepare] gives it to a message that leaves CorrelationID
// empty: one that is not valid UTF-8 (a foreign producer's raw AMQP
// correlation-id, a correlation header's bytes) becomes the text ID Prepare
// derives from it. Written as it is, it would make Prepare refuse the
// message (and the correlation header), where a publish without telemetry
// succeeds.
func inheritedCorrelationID(corr string) string {
	if utf8.ValidString(corr) {
		return corr
	}
	scratch := sdk.Message{ID: "scratch"}
	if sdk.Prepare(sdk.WithCorrelationID(context.Background(), corr), "scratch", &scratch, 0) != nil {
		return "" // cannot happen: nothing of scratch is invalid
	}
	return scratch.CorrelationID
}

// startSend starts the PRODUCER span of m under parent.
func (o *Observer) startSend(parent context.Context, m *sdk.Message, pl *pubLabels, create bool, buf *startBuf) (context.Context, trace.Span) {
	name, base := pl.sendName, pl.sendAttrs
	if create {
		name, base = pl.createName, pl.createAttrs
	}
	attrs := append(buf.attrs[:0], base...)
	attrs = append(attrs,
		semconv.MessagingMessageID(validText(m.ID)),
		semconv.MessagingMessageConversationID(validText(m.CorrelationID)),
	)
	if m.Type != "" {
		attrs = append(attrs, AttrJobType.String(validText(m.Type)))
	}
	opts := append(buf.opts[:0], producerKind, buf.withAttributes(len(attrs)))
	return o.tracer.Start(parent, name, opts...)
}

// startBuf holds, for the duration of one span start, the attributes and
// options a span is started with, so that starting a span allocates nothing
// of berth's own: the options that box a slice (WithAttributes, WithLinks)
// are made once per buffer and length and reused, which is safe because a
// tracer copies what it keeps before Start returns. It also holds a header
// carrier for the propagator.
type startBuf struct {
	attrs     [8]attribute.KeyValue
	withAttrs [9]trace.SpanStartOption // withAttrs[n] selects attrs[:n]
	opts      [4]trace.SpanStartOption
	link      [1]trace.Link
	withLink  trace.SpanStartOption // selects link[:]
	carrier   pairCarrier
}

var startBufs = sync.Pool{New: func() any { return new(startBuf) }}

func getStartBuf() *startBuf {
	b := startBufs.Get().(*startBuf)
	b.carrier.kv = b.carrier.kv[:0]
	return b
}

// withAttributes returns trace.WithAttributes(b.attrs[:n]...).
func (b *startBuf) withAttributes(n int) trace.SpanStartOption {
	if b.withAttrs[n] == nil {
		b.withAttrs[n] = trace.WithAttributes(b.attrs[:n]...)
	}
	return b.withAttrs[n]
}

// withLinks returns trace.WithLinks(b.link[:]...).
func (b *startBuf) withLinks() trace.SpanStartOption {
	if b.withLink == nil {
		b.withLink = trace.WithLinks(b.link[:]...)
	}
	return b.withLink
}

// The W3C Trace Context headers.
const (
	traceparentHeader = "traceparent"
	tracestateHeader  = "tracestate"
)

// pairCarrier is a [propagation.TextMapCarrier] that collects what a
// propagator injects as key and value pairs, so that nothing is allocated
// when it injects nothing.
type pairCarrier struct{ kv []string }

// Get returns the value set for key, or "".
func (c *pairCarrier) Get(key string) string {
	for i := len(c.kv) - 2; i >= 0; i -= 2 {
		if c.kv[i] == key {
			return c.kv[i+1]
		}
	}
	return ""
}

// Set records key and value.
func (c *pairCarrier) Set(key, value string) { c.kv = append(c.kv, key, value) }

// Keys lists the keys set.
func (c *pairCarrier) Keys() []string {
	keys := make([]string, 0, len(c.kv)/2)
	for i := 0; i < len(c.kv); i += 2 {
		keys = append(keys, c.kv[i])
	}
	return keys
}

// merge returns a copy of h with the pairs set, or h itself when none were
// set and always is false. A header map shared by several messages is never
// written to. When a "traceparent" is set, h's "tracestate" is not kept: it
// belongs to h's traceparent (W3C Trace Context), and a propagator writes
// none for a span without one.
func (c *pairCarrier) merge(h map[string]string, always bool) map[string]string {
	if len(c.kv) == 0 && !always {
		return h
	}
	newParent := c.Get(traceparentHeader) != ""
	out := make(map[string]string, len(h)+len(c.kv)/2)
	for k, v := range h {
		if newParent && k == tracestateHeader {
			continue
		}
		out[k] = v
	}
	for i := 0; i < len(c.kv); i += 2 {
		out[c.kv[i]] = c.kv[i+1]
	}
	return out
}

// TxPublisher is an [sdk.TxPublisher] that traces and counts what it
// publishes inside the caller's transaction exactly as [Observer.Publisher]
// does for Publish: a producer span per message (and a send span for a
// batch), the trace context and correlation ID written into the messages
// (so the consumer, or the outbox relay, continues the trace), and the
// sent-messages counter, under the messaging.system of the wrapped
// publisher ("postgres" for the PostgreSQL broker, "outbox" for the
// outbox). A message counts as sent when PublishTx returns nil: it is
// published if and when the transaction commits.
//
// Create it with [WrapTx]. PublishTx may be called concurrently when the
// wrapped one may.
type TxPublisher[Tx any] struct {
	obs  *Observer
	next sdk.TxPublisher[Tx]
}

// WrapTx returns p decorated by o with tracing, header propagation,
// correlation IDs and the sent-messages counter, as [Observer.Publisher]
// decorates a Publisher. (A function, not a method: Go methods take no type
// parameters.) Go infers Tx from an sdk.TxPublisher value but not from a
// concrete type: write telemetry.WrapTx[pgx.Tx](o, box) for an
// *outbox.Outbox or a *postgres.Broker.
func WrapTx[Tx any](o *Observer, p sdk.TxPublisher[Tx]) *TxPublisher[Tx] {
	return &TxPublisher[Tx]{obs: o, next: p}
}

// Unwrap returns the wrapped TxPublisher.
func (p *TxPublisher[Tx]) Unwrap() sdk.TxPublisher[Tx] { return p.next }

// PublishTx traces and publishes msgs to queue inside tx. See [TxPublisher].
func (p *TxPublisher[Tx]) PublishTx(ctx context.Context, tx Tx, queue string, msgs ...*sdk.Message) error {
	return p.obs.publish(ctx, p.next, queue, msgs, func() error { return p.next.PublishTx(ctx, tx, queue, msgs...) })
}

// invalidQueue stands for every invalid queue name in spans and metrics.
const invalidQueue = "_invalid"

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
