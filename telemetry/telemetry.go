package telemetry

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/sdk"
)

// ScopeName is the instrumentation scope of berth's tracer and meter.
const ScopeName = "github.com/berthq/berth/telemetry"

// Attribute keys berth adds to the messaging semantic conventions.
const (
	AttrJobType          = attribute.Key("berth.job.type")
	AttrAttempt          = attribute.Key("berth.delivery.attempt")
	AttrAction           = attribute.Key("berth.settlement.action")
	AttrRetryDelay       = attribute.Key("berth.retry.delay") // seconds
	AttrDeadLetterReason = attribute.Key("berth.dead_letter.reason")
	AttrSettleError      = attribute.Key("berth.settlement.error")      // spans: the failed call's error text
	AttrSettleErrorType  = attribute.Key("berth.settlement.error_type") // metrics: its bounded type
	AttrQueueState       = attribute.Key("berth.queue.state")
	AttrResource         = attribute.Key("berth.resource.type")
	AttrLockAcquired     = attribute.Key("berth.lock.acquired")
	AttrLeaseResult      = attribute.Key("berth.lease.result")
	AttrIdempotencyEvent = attribute.Key("berth.idempotency.event")
)

// InspectedQueue names a queue whose depth and oldest message age are reported
// as observable gauges, read through Inspector at each collection, under
// messaging.system (Inspector's, as for deliveries: see [Options.System]) and
// messaging.destination.name.
type InspectedQueue struct {
	Inspector sdk.Inspector
	Queue     string
}

// Options configures [New]. The zero value uses the global OpenTelemetry
// tracer and meter providers, and [DefaultPropagator] (W3C trace context and
// baggage, whatever the global propagator is, so that headers are always
// written and read the same way).
type Options struct {
	// TracerProvider creates berth's tracer. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider creates berth's meter. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator writes and reads the trace headers. Default DefaultPropagator.
	Propagator propagation.TextMapPropagator
	// System is the messaging.system attribute. Default: derived from the
	// broker's package ("rabbitmq", "aws_sqs", "postgres", "memory").
	System string
	// CorrelationHeader, when set, names a header that also carries the
	// correlation ID, for consumers outside berth ("x-correlation-id"): the
	// Publisher writes it, and the Observer reads it when a message arrives
	// without a CorrelationID (published by a producer outside berth).
	// Default none: berth brokers carry Message.CorrelationID themselves.
	// New refuses a name Publish could not write (see [New]).
	CorrelationHeader string
	// LinkOnly starts each delivery's process span as the root of a new trace,
	// linked to the message's creation span, instead of as its child.
	LinkOnly bool
	// Queues are reported by the queue depth and oldest age gauges, under
	// messaging.system and the queue's name: queues of one name on brokers
	// of different systems are series of their own, a queue listed twice
	// on one broker is read once, and two brokers of the same system with
	// a queue of the same name (two RabbitMQ clusters) share one series —
	// give each its own Observer and MeterProvider to tell them apart.
	Queues []InspectedQueue
	// InspectTimeout bounds each Stats call of a collection. Default 5s.
	InspectTimeout time.Duration
	// JobTypes are job types that always get their own berth.job.type value
	// in metrics (declare the types your handlers register).
	JobTypes []string
	// MaxJobTypes bounds how many other job types, first seen first served,
	// get their own berth.job.type value; deliveries of the rest (and of
	// types that are not valid UTF-8 or are longer than
	// [sdk.MaxLogTextLength] bytes) are counted under [OtherJobType]. A job
	// type comes from the message, which anyone who can publish chooses,
	// and every value costs a label set per instrument, kept for the
	// Observer's life. Default 100; negative: only JobTypes.
	MaxJobTypes int
}

// OtherJobType is the berth.job.type value (in metrics, process spans and
// the idempotency counters) of job types beyond [Options.JobTypes] and
// [Options.MaxJobTypes], and of undeclared ones that are not valid UTF-8 or
// are longer than [sdk.MaxLogTextLength] bytes. Log records keep the
// message's own type (cut as [sdk.LogText] cuts it).
const OtherJobType = "_OTHER"

// defaultMaxJobTypes is the default [Options.MaxJobTypes].
const defaultMaxJobTypes = 100

// Observer is the telemetry of one process: an [sdk.Observer] and
// [sdk.LeaseObserver] for Workers, a factory of traced publishers
// ([Observer.Publisher]), and the recorder of the counters other packages feed.
// It is safe for concurrent use. Close unregisters its queue gauge callbacks.
//
// Instruments (units in UCUM, names after the OpenTelemetry conventions):
//
//	messaging.client.sent.messages        counter   {message}    published (error.type on failure)
//	messaging.client.consumed.messages    counter   {message}    deliveries started
//	messaging.process.duration            histogram s            handler run time, per berth.job.type
//	berth.worker.in_flight                updown    {delivery}   deliveries being handled (observed)
//	berth.delivery.redeliveries           counter   {delivery}   deliveries with attempt > 1
//	berth.delivery.settlements            counter   {delivery}   per berth.settlement.action and error.type, berth.settlement.error_type when the call failed
//	berth.delivery.claim_to_ack.duration  histogram s            receive (claim) to successful ack
//	berth.job.errors                      counter   {error}      handler errors per error.type (class); not a lost lease or shutdown
//	berth.job.retries                     counter   {retry}      retries per berth.job.type
//	berth.job.dead_letters                counter   {message}    dead letters per berth.job.type and error.type
//	berth.retry.delay                     histogram s            backoff and retry-after delays
//	berth.lease.extensions                counter   {extension}  heartbeat extensions, berth.lease.result ok|failed
//	berth.lease.expirations               counter   {lease}      leases lost while handling or settling
//	berth.queue.depth                     gauge     {message}    per berth.queue.state ready|delayed|in_flight|dead_lettered
//	berth.queue.oldest_age                gauge     s            age of the oldest ready message
//	berth.idempotency.duplicates          counter   {message}    duplicates suppressed (fed by idempotency)
//	berth.idempotency.conflicts           counter   {conflict}   same key, different payload (fed by idempotency)
//	berth.idempotency.events              counter   {event}      every guard event, per berth.idempotency.event (fed by idempotency)
//	berth.concurrency.version_conflicts   counter   {conflict}   optimistic-lock conflicts (fed by concurrency)
//	berth.concurrency.lock_wait.duration  histogram s            row-lock wait time (fed by concurrency)
//
// Every delivery metric carries messaging.system, messaging.destination.name
// and berth.job.type; the queue gauges messaging.system and
// messaging.destination.name.
type Observer struct {
	tracer     trace.Tracer
	noopTracer bool // tracer is the no-op one: no span work at all (see Start)
	prop       propagation.TextMapPropagator
	system     string
	linkOnly   bool
	corrHeader string
	queues     []InspectedQueue
	queueSys   []attribute.KeyValue // messaging.system of each of queues
	inspectTTL time.Duration
	regs       []metric.Registration

	// Counted on every message: atomics in the cached label sets, reported by
	// a callback at each collection (an SDK Add costs ~300 ns; an atomic add
	// a few).
	sent, consumed, redeliveries, settlements, jobErrors, retries, deadLetters, leaseExp metric.Int64ObservableCounter
	inFlight                                                                             metric.Int64ObservableUpDownCounter
	// Counted on rarer events, synchronously.
	leaseExt, duplicates, idemConflicts, idemEvents, versionConflicts metric.Int64Counter
	processDur, claimToAck, retryDelay, lockWait                      metric.Float64Histogram
	depth                                                             metric.Int64ObservableGauge
	oldest                                                            metric.Float64ObservableGauge

	systems    sync.Map // reflect.Type -> string
	lastSystem atomic.Pointer[systemName]
	lastLabels atomic.Pointer[labelsEntry]    // the last labelsFor answer
	lastPub    atomic.Pointer[pubLabelsEntry] // the last publishLabels answer

	mu        sync.RWMutex // guards labels, pubLabels, regs, jobTypes
	labels    map[labelKey]*labels
	pubLabels map[labelKey]*pubLabels
	// jobTypes are the job types with their own label value: Options.JobTypes
	// and then the first maxSeen others seen (seen counts those).
	jobTypes      map[string]bool
	maxSeen, seen int
}

var (
	_ sdk.Observer      = (*Observer)(nil)
	_ sdk.LeaseObserver = (*Observer)(nil)
)

// durationBuckets are the boundaries the messaging conventions advise for
// messaging.process.duration, in seconds, widened for long jobs.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60, 300}

// delayBuckets suit backoff delays, in seconds.
var delayBuckets = []float64{0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600, 43200}

// New creates the instruments and registers the callbacks that report the
// delivery counters and the queue gauges. It returns an error for an invalid
// InspectedQueue, for a
// CorrelationHeader no publish could carry (a [*sdk.HeaderError], matching
// [sdk.ErrInvalidHeader]: not valid UTF-8, a reserved berth- name, or a
// header of the Propagator's), or when the meter refuses an instrument.
func New(opts Options) (*Observer, error) {
	if opts.TracerProvider == nil {
		opts.TracerProvider = otel.GetTracerProvider()
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = otel.GetMeterProvider()
	}
	if opts.Propagator == nil {
		opts.Propagator = DefaultPropagator
	}
	if opts.InspectTimeout <= 0 {
		opts.InspectTimeout = 5 * time.Second
	}
	for i, q := range opts.Queues {
		if q.Inspector == nil {
			return nil, fmt.Errorf("berth: telemetry: Queues[%d]: nil Inspector", i)
		}
		if err := sdk.ValidateQueueName(q.Queue); err != nil {
			return nil, fmt.Errorf("berth: telemetry: Queues[%d]: %w", i, err)
		}
	}
	if err := checkCorrelationHeader(opts.CorrelationHeader, opts.Propagator); err != nil {
		return nil, fmt.Errorf("berth: telemetry: CorrelationHeader: %w", err)
	}
	if opts.MaxJobTypes == 0 {
		opts.MaxJobTypes = defaultMaxJobTypes
	}
	o := &Observer{
		maxSeen:    max(opts.MaxJobTypes, 0),
		jobTypes:   make(map[string]bool, len(opts.JobTypes)),
		tracer:     opts.TracerProvider.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:       opts.Propagator,
		system:     opts.System,
		linkOnly:   opts.LinkOnly,
		corrHeader: opts.CorrelationHeader,
		queues:     append([]InspectedQueue(nil), opts.Queues...),
		inspectTTL: opts.InspectTimeout,
		labels:     make(map[labelKey]*labels),
		pubLabels:  make(map[labelKey]*pubLabels),
	}
	_, o.noopTracer = o.tracer.(noop.Tracer)
	// A queue listed twice on one broker is read once. Two brokers of one
	// messaging.system with a queue of the same name (two RabbitMQ
	// clusters) still share one series, as before messaging.system was
	// added: said on Options.Queues.
	queues := o.queues[:0:0]
	for _, q := range o.queues {
		if slices.ContainsFunc(queues, func(p InspectedQueue) bool { return p.Queue == q.Queue && sameInspector(p.Inspector, q.Inspector) }) {
			continue
		}
		queues = append(queues, q)
		o.queueSys = append(o.queueSys, semconv.MessagingSystemKey.String(o.systemOf(q.Inspector)))
	}
	o.queues = queues
	for _, t := range opts.JobTypes {
		o.jobTypes[t] = true
	}
	m := opts.MeterProvider.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	observed := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	hist := func(name, desc string, bounds []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	o.sent = observed("messaging.client.sent.messages", "{message}", "Messages published.")
	o.consumed = observed("messaging.client.consumed.messages", "{message}", "Deliveries handed to a handler.")
	o.redeliveries = observed("berth.delivery.redeliveries", "{delivery}", "Deliveries with attempt > 1 (retries and crash redeliveries).")
	o.settlements = observed("berth.delivery.settlements", "{delivery}", "Deliveries settled, per action.")
	o.jobErrors = observed("berth.job.errors", "{error}", "Handler errors, per error class.")
	o.retries = observed("berth.job.retries", "{retry}", "Deliveries retried.")
	o.deadLetters = observed("berth.job.dead_letters", "{message}", "Deliveries dead-lettered.")
	o.leaseExt = counter("berth.lease.extensions", "{extension}", "Lease extensions by the heartbeat.")
	o.leaseExp = observed("berth.lease.expirations", "{lease}", "Leases lost while handling or settling.")
	o.duplicates = counter("berth.idempotency.duplicates", "{message}", "Duplicate deliveries suppressed by the idempotency layer.")
	o.idemConflicts = counter("berth.idempotency.conflicts", "{conflict}", "Idempotency keys reused with a different payload.")
	o.idemEvents = counter("berth.idempotency.events", "{event}", "Idempotency guard events, per berth.idempotency.event.")
	o.versionConflicts = counter("berth.concurrency.version_conflicts", "{conflict}", "Optimistic-lock version conflicts.")
	o.processDur = hist("messaging.process.duration", "Handler run time.", durationBuckets)
	o.claimToAck = hist("berth.delivery.claim_to_ack.duration", "Time from the receive that claimed a delivery to its successful ack.", durationBuckets)
	o.retryDelay = hist("berth.retry.delay", "Delay before a retried delivery comes back.", delayBuckets)
	o.lockWait = hist("berth.concurrency.lock_wait.duration", "Time spent waiting for a row lock.", durationBuckets)
	var err error
	o.inFlight, err = m.Int64ObservableUpDownCounter("berth.worker.in_flight", metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries being handled."))
	errs = append(errs, err)
	o.depth, err = m.Int64ObservableGauge("berth.queue.depth", metric.WithUnit("{message}"),
		metric.WithDescription("Messages in a queue, per state."))
	errs = append(errs, err)
	o.oldest, err = m.Float64ObservableGauge("berth.queue.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest ready message."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("berth: telemetry: creating instruments: %w", err)
	}
	if len(o.queues) > 0 {
		reg, err := m.RegisterCallback(o.observeQueues, o.depth, o.oldest)
		if err != nil {
			return nil, fmt.Errorf("berth: telemetry: registering queue gauges: %w", err)
		}
		o.regs = append(o.regs, reg)
	}
	// Registered last and never unregistered (see Close): nothing can fail
	// after it, so a failed New leaves no callback behind.
	if _, err := m.RegisterCallback(o.observeCounts, o.sent, o.consumed, o.redeliveries, o.settlements,
		o.jobErrors, o.retries, o.deadLetters, o.leaseExp, o.inFlight); err != nil {
		errs := []error{fmt.Errorf("berth: telemetry: registering the delivery counters: %w", err)}
		for _, r := range o.regs {
			errs = append(errs, r.Unregister())
		}
		return nil, errors.Join(errs...)
	}
	return o, nil
}

// checkCorrelationHeader returns a [*sdk.HeaderError] (wrapping
// [sdk.ErrInvalidHeader]) for a correlation header name h that every
// publish would fail on or that would break tracing: one that is not
// non-empty valid UTF-8 ([sdk.ValidateHeaders]), a reserved berth- name
// ([sdk.IsReservedHeader], refused by [sdk.Prepare]), or a header the
// propagator writes ("traceparent", "tracestate", "baggage"), which the
// correlation ID would overwrite. "" (none) is valid.
func checkCorrelationHeader(h string, prop propagation.TextMapPropagator) error {
	if h == "" {
		return nil
	}
	if err := sdk.ValidateHeaders(map[string]string{h: ""}); err != nil {
		return err
	}
	if sdk.IsReservedHeader(h) {
		return &sdk.HeaderError{Name: h, Reason: "names starting with " + sdk.ReservedHeaderPrefix + " are reserved for brokers"}
	}
	for _, f := range prop.Fields() {
		if strings.EqualFold(h, f) {
			return &sdk.HeaderError{Name: h, Reason: "written by the trace propagator"}
		}
	}
	return nil
}

// Close unregisters the queue gauge callbacks (depth and oldest age, which
// call the Inspectors): call it when the Observer is no longer used, before
// closing the brokers it inspects. The delivery counters (and the in-flight
// count) stay registered with the MeterProvider, so that its final export
// (MeterProvider.Shutdown or ForceFlush after Close) still reports what the
// Observer counted; they go with the MeterProvider. It is safe to call twice.
func (o *Observer) Close() error {
	o.mu.Lock()
	regs := o.regs
	o.regs = nil
	o.mu.Unlock()
	var errs []error
	for _, r := range regs {
		errs = append(errs, r.Unregister())
	}
	return errors.Join(errs...)
}

func (o *Observer) observeQueues(ctx context.Context, obs metric.Observer) error {
	var errs []error
	for i, q := range o.queues {
		sctx, cancel := context.WithTimeout(ctx, o.inspectTTL)
		st, err := q.Inspector.Stats(sctx, q.Queue)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("stats of %s: %w", q.Queue, err))
			continue
		}
		sys, dest := o.queueSys[i], semconv.MessagingDestinationName(q.Queue)
		for _, s := range []struct {
			state string
			n     int64
		}{{"ready", st.Ready}, {"delayed", st.Delayed}, {"in_flight", st.InFlight}, {"dead_lettered", st.DeadLettered}} {
			obs.ObserveInt64(o.depth, s.n, metric.WithAttributes(sys, dest, AttrQueueState.String(s.state)))
		}
		obs.ObserveFloat64(o.oldest, st.OldestAge.Seconds(), metric.WithAttributes(sys, dest))
	}
	return errors.Join(errs...)
}

// systemOf names the messaging system of a broker's value (a Delivery or a
// Publisher) from its package path. A publishing wrapper (one with an
// Unwrap() sdk.Publisher method: the ledger's, an sdk.AsyncPool, an
// sdk.LongDelay, this package's own) is looked through to the publisher it
// wraps, so that Publisher(l.Publisher(rabbit)) counts under "rabbitmq", not
// "ledger".
func (o *Observer) systemOf(v any) string {
	if o.system != "" {
		return o.system
	}
	for range maxUnwrap {
		u, ok := v.(interface{ Unwrap() sdk.Publisher })
		if !ok {
			break
		}
		next := u.Unwrap()
		if next == nil {
			break
		}
		v = next
	}
	t := reflect.TypeOf(v)
	if last := o.lastSystem.Load(); last != nil && last.t == t { // one broker type, usually
		return last.name
	}
	if s, ok := o.systems.Load(t); ok {
		o.lastSystem.Store(&systemName{t, s.(string)})
		return s.(string)
	}
	rt := t
	for rt != nil && rt.Kind() == reflect.Pointer {
		rt = rt.Elem()
	}
	name := "berth"
	if rt != nil && rt.PkgPath() != "" {
		p := rt.PkgPath()
		name = p[strings.LastIndexByte(p, '/')+1:]
		switch name {
		case "sqs":
			name = "aws_sqs"
		case "main":
			name = "berth"
		}
	}
	o.systems.Store(t, name)
	return name
}

// maxUnwrap bounds how many publishing wrappers systemOf looks through.
const maxUnwrap = 16

// labelKey identifies the attribute set of one queue and job type.
type labelKey struct {
	system, queue, jobType string
}

// outcomeKey refines a labelKey with a settlement action, error class and
// the settlement call's error type ([settleErrorType]).
type outcomeKey struct {
	action    sdk.Action
	class     sdk.ErrorClass
	settleErr string
}

// labels caches what recording with one attribute set needs, so that the
// hot path allocates nothing for metrics. Base labels (one per labelKey) also
// carry the span name and attributes, the in-flight count, and their
// outcome refinements.
type labels struct {
	add     []metric.AddOption
	record  []metric.RecordOption
	observe []metric.ObserveOption

	spanName  string
	spanAttrs []attribute.KeyValue
	key       labelKey

	// Counts of the base set: in flight, consumed, redelivered, leases
	// expired. Of an outcome set: settled (action and class), and for class
	// only: errors, retries, dead letters.
	inFlight, consumed, redeliveries, leaseExp atomic.Int64
	settled, errors, retries, deadLetters      atomic.Int64

	mu       sync.RWMutex
	outcomes map[outcomeKey]*labels
	acked    atomic.Pointer[labels] // outcomes' entry for an ack without error
}

// jobLabel returns the berth.job.type value of job type t: t itself when it
// is declared or among the first [Options.MaxJobTypes] others seen, else
// [OtherJobType]. A type that is not valid UTF-8, or longer than
// [sdk.MaxLogTextLength] bytes, is never a label of its own: an OTLP exporter
// refuses a whole batch with one invalid string, and a label value is
// exported on every data point of its set at every collection.
func (o *Observer) jobLabel(t string) string {
	o.mu.RLock()
	known := o.jobTypes[t]
	full := o.seen >= o.maxSeen
	o.mu.RUnlock()
	if known {
		return t
	}
	if full || len(t) > sdk.MaxLogTextLength || !utf8.ValidString(t) {
		return OtherJobType
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.jobTypes[t]:
	case o.seen < o.maxSeen:
		o.jobTypes[t] = true
		o.seen++
	default:
		return OtherJobType
	}
	return t
}

// labelsFor returns the base labels of k, made once, with k's job type
// replaced by its label value ([Observer.jobLabel]). Their number is that of
// (system, queue, job type label) combinations, bounded by
// [Options.MaxJobTypes] whatever the messages say.
func (o *Observer) labelsFor(k labelKey) *labels {
	// Consecutive deliveries mostly share their labels: one comparison
	// instead of a read lock shared by every handler goroutine and a hash
	// of three strings.
	if last := o.lastLabels.Load(); last != nil && last.key == k {
		return last.l
	}
	l := o.lookupLabels(k)
	o.lastLabels.Store(&labelsEntry{k, l})
	return l
}

// systemName and labelsEntry are the one-entry caches of systemOf and
// labelsFor.
type systemName struct {
	t    reflect.Type
	name string
}

type labelsEntry struct {
	key labelKey // as asked, before jobLabel
	l   *labels
}

func (o *Observer) lookupLabels(k labelKey) *labels {
	o.mu.RLock()
	l, ok := o.labels[k]
	o.mu.RUnlock()
	if ok {
		return l // only admitted job types are cached
	}
	if k.jobType = o.jobLabel(k.jobType); k.jobType == OtherJobType {
		o.mu.RLock()
		l, ok = o.labels[k]
		o.mu.RUnlock()
		if ok {
			return l
		}
	}
	sys, dest, job := semconv.MessagingSystemKey.String(k.system), semconv.MessagingDestinationName(k.queue), AttrJobType.String(k.jobType)
	opt := metric.WithAttributeSet(attribute.NewSet(sys, dest, job))
	l = &labels{
		add:       []metric.AddOption{opt},
		record:    []metric.RecordOption{opt},
		observe:   []metric.ObserveOption{opt},
		spanName:  "process " + k.queue,
		spanAttrs: []attribute.KeyValue{sys, dest, semconv.MessagingOperationName("process"), semconv.MessagingOperationTypeProcess, job},
		key:       k,
		outcomes:  make(map[outcomeKey]*labels),
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if prev, ok := o.labels[k]; ok {
		return prev
	}
	o.labels[k] = l
	return l
}

// outcome returns l refined with action, class and settleErr (any may be
// empty).
func (l *labels) outcome(action sdk.Action, class sdk.ErrorClass, settleErr string) *labels {
	if action == sdk.ActionAck && class == sdk.ClassNone && settleErr == "" { // most settlements: no lock, no map
		if r := l.acked.Load(); r != nil {
			return r
		}
		r := l.lookupOutcome(outcomeKey{action, class, settleErr})
		l.acked.Store(r)
		return r
	}
	return l.lookupOutcome(outcomeKey{action, class, settleErr})
}

func (l *labels) lookupOutcome(ok outcomeKey) *labels {
	l.mu.RLock()
	r, found := l.outcomes[ok]
	l.mu.RUnlock()
	if found {
		return r
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(l.key.system),
		semconv.MessagingDestinationName(l.key.queue),
		AttrJobType.String(l.key.jobType),
	}
	if ok.action != "" {
		attrs = append(attrs, AttrAction.String(string(ok.action)))
	}
	if ok.class != sdk.ClassNone {
		attrs = append(attrs, semconv.ErrorTypeKey.String(string(ok.class)))
	}
	if ok.settleErr != "" {
		attrs = append(attrs, AttrSettleErrorType.String(ok.settleErr))
	}
	opt := metric.WithAttributeSet(attribute.NewSet(attrs...))
	r = &labels{add: []metric.AddOption{opt}, record: []metric.RecordOption{opt}, observe: []metric.ObserveOption{opt}, key: l.key}
	l.mu.Lock()
	defer l.mu.Unlock()
	if prev, ok2 := l.outcomes[ok]; ok2 {
		return prev
	}
	l.outcomes[ok] = r
	return r
}

// observeCounts reports the counters kept in the label sets. A set whose
// count never moved is not reported.
func (o *Observer) observeCounts(_ context.Context, obs metric.Observer) error {
	report := func(inst metric.Int64Observable, n *atomic.Int64, l *labels) {
		if v := n.Load(); v != 0 {
			obs.ObserveInt64(inst, v, l.observe...)
		}
	}
	o.mu.RLock()
	defer o.mu.RUnlock()
	for _, l := range o.labels {
		obs.ObserveInt64(o.inFlight, l.inFlight.Load(), l.observe...)
		report(o.consumed, &l.consumed, l)
		report(o.redeliveries, &l.redeliveries, l)
		report(o.leaseExp, &l.leaseExp, l)
		l.mu.RLock()
		for _, r := range l.outcomes {
			report(o.settlements, &r.settled, r)
			report(o.jobErrors, &r.errors, r)
			report(o.retries, &r.retries, r)
			report(o.deadLetters, &r.deadLetters, r)
		}
		l.mu.RUnlock()
	}
	for _, p := range o.pubLabels {
		report(o.sent, &p.sent, &p.labels)
		p.mu.Lock()
		for _, f := range p.failed {
			report(o.sent, &f.sent, &f.labels)
		}
		p.mu.Unlock()
	}
	return nil
}

// validText returns s as a log record shows it ([sdk.LogText]): made valid
// UTF-8 (each run of invalid bytes becomes one U+FFFD) and cut to
// [sdk.MaxLogTextLength] bytes, ending in "…" when cut. Message fields come
// from the producer, which may be outside berth and write any bytes of any
// length: an OTLP exporter refuses a whole batch of spans with one attribute
// that is not valid UTF-8, or one past the receiver's message size limit.
func validText(s string) string {
	if len(s) <= sdk.MaxLogTextLength && utf8.ValidString(s) {
		return s
	}
	return sdk.LogText("", s).Value.String()
}

// noSpan is the span of a delivery or a publish with a no-op tracer.
var noSpan trace.Span = noop.Span{}

// ctxKey finds a delivery's state in its context: that of Observer o, or
// with o nil the innermost of any Observer.
type ctxKey struct{ o *Observer }

// FromContext returns the Observer handling the delivery of ctx (set by
// [Observer.Start]), or nil. Every recording method of Observer accepts a nil
// receiver, so other packages can call FromContext(ctx).DuplicateSuppressed(ctx, "")
// without checking.
func FromContext(ctx context.Context) *Observer {
	if st := stateFrom(ctx); st != nil {
		return st.obs
	}
	return nil
}

// sameInspector reports whether a and b are the same broker (a queue listed
// twice on it reports the same values twice, which is harmless).
func sameInspector(a, b sdk.Inspector) bool {
	if t := reflect.TypeOf(a); t == nil || t != reflect.TypeOf(b) || !t.Comparable() {
		return false
	}
	return a == b
}
