package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/berthq/berth/idempotency"
)

// The recording methods below are how the idempotency and concurrency
// packages feed the counters only they can see. They take a context so that,
// called from inside a handler, they label the measurement with the delivery
// (system, queue, job type) and mark the process span. Each accepts a nil
// receiver and then does nothing, so FromContext(ctx).X(...) is always safe.
//
// A package that does not want to import telemetry declares the interface it
// needs, for example
//
//	type Metrics interface {
//		DuplicateSuppressed(ctx context.Context, jobType string)
//		IdempotencyConflict(ctx context.Context, jobType string)
//	}
//
// and *Observer satisfies it.

// DuplicateSuppressed counts a delivery whose effect was already done (the
// idempotency store or cache had its key), so the handler did not run again.
// jobType "" means the job type of the delivery in ctx.
func (o *Observer) DuplicateSuppressed(ctx context.Context, jobType string) {
	if o == nil {
		return
	}
	o.duplicates.Add(ctx, 1, o.jobOpts(ctx, jobType)...)
	addEvent(ctx, "berth.duplicate_suppressed")
}

// IdempotencyConflict counts an idempotency key reused with a different
// payload (the delivery is dead-lettered with ErrKeyConflict). jobType "" means
// the job type of the delivery in ctx.
func (o *Observer) IdempotencyConflict(ctx context.Context, jobType string) {
	if o == nil {
		return
	}
	o.idemConflicts.Add(ctx, 1, o.jobOpts(ctx, jobType)...)
	addEvent(ctx, "berth.idempotency_conflict")
}

// VersionConflict counts an optimistic-lock conflict (an UPDATE … WHERE
// version = $n that matched no row) on resource, a resource type such as
// "orders" (never a row ID: it is a metric label).
func (o *Observer) VersionConflict(ctx context.Context, resource string) {
	if o == nil {
		return
	}
	o.versionConflicts.Add(ctx, 1, metric.WithAttributes(o.resourceAttrs(ctx, resource)...))
	addEvent(ctx, "berth.version_conflict", AttrResource.String(resource))
}

// LockWait records the time spent waiting for a row lock on resource (a
// resource type such as "orders"), and whether the lock was acquired (false:
// lock_timeout or NOWAIT busy).
func (o *Observer) LockWait(ctx context.Context, resource string, wait time.Duration, acquired bool) {
	if o == nil {
		return
	}
	attrs := append(o.resourceAttrs(ctx, resource), AttrLockAcquired.Bool(acquired))
	o.lockWait.Record(ctx, wait.Seconds(), metric.WithAttributes(attrs...))
}

// jobOpts labels a job-level counter with the delivery in ctx, or with
// jobType alone outside a delivery. As in [Observer.jobAttrs], the job type
// label is o's own.
func (o *Observer) jobOpts(ctx context.Context, jobType string) []metric.AddOption {
	if st := stateFrom(ctx); st != nil {
		k := st.l.key // its job type is the label of the Observer that started the delivery
		switch {
		case jobType != "":
			k.jobType = jobType
		case st.obs != o:
			k.jobType = st.d.Message().Type
		}
		return o.labelsFor(k).add
	}
	return []metric.AddOption{metric.WithAttributes(AttrJobType.String(o.jobLabel(jobType)))}
}

func (o *Observer) resourceAttrs(ctx context.Context, resource string) []attribute.KeyValue {
	attrs := []attribute.KeyValue{AttrResource.String(resource)}
	if stateFrom(ctx) != nil {
		attrs = append(attrs, o.jobAttrs(ctx, "")...) // o's own job type label
	}
	return attrs
}

// Idempotency returns the [idempotency.Observer] to put in
// idempotency.Options.Observer: every guard event is counted in
// berth.idempotency.events (attribute berth.idempotency.event), duplicates
// suppressed also in berth.idempotency.duplicates and key conflicts in
// berth.idempotency.conflicts (see [Observer.DuplicateSuppressed] and
// [Observer.IdempotencyConflict]).
func (o *Observer) Idempotency() idempotency.Observer { return idempotencyObserver{o} }

type idempotencyObserver struct{ o *Observer }

func (i idempotencyObserver) Observe(ctx context.Context, e idempotency.Event, jobType string) {
	o := i.o
	if o == nil {
		return
	}
	attrs := append(o.jobAttrs(ctx, jobType), AttrIdempotencyEvent.String(string(e)))
	o.idemEvents.Add(ctx, 1, metric.WithAttributes(attrs...))
	switch e {
	case idempotency.EventDuplicate:
		o.DuplicateSuppressed(ctx, jobType)
	case idempotency.EventConflict:
		o.IdempotencyConflict(ctx, jobType)
	}
}

// RowLockObserved records one row-lock attempt: it has the signature of
// rowlock.Options.Observe, so wire it as
//
//	rowlock.Options{Table: "orders", Observe: tel.RowLockObserved}
//
// table labels the wait (berth.resource.type); err nil means acquired.
func (o *Observer) RowLockObserved(ctx context.Context, table string, waited time.Duration, err error) {
	o.LockWait(ctx, table, waited, err == nil)
}

// VersionConflictHook returns a function with the signature of
// optimistic.Retrier.OnConflict that counts each conflict on resource:
//
//	optimistic.Retrier{OnConflict: tel.VersionConflictHook("orders")}
func (o *Observer) VersionConflictHook(resource string) func(ctx context.Context, attempt int, err error) {
	return func(ctx context.Context, _ int, _ error) { o.VersionConflict(ctx, resource) }
}

// jobAttrs labels a measurement with the delivery in ctx, or with jobType
// alone outside a delivery. The job type label is always o's own
// ([Observer.jobLabel]): a delivery started by another Observer carries the
// label that Observer chose, under its own type limit.
func (o *Observer) jobAttrs(ctx context.Context, jobType string) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 4)
	if st := stateFrom(ctx); st != nil {
		switch {
		case jobType == "" && st.obs == o:
			jobType = st.l.key.jobType // already o's label value
		case jobType == "":
			jobType = o.jobLabel(st.d.Message().Type)
		default:
			jobType = o.jobLabel(jobType)
		}
		attrs = append(attrs,
			semconv.MessagingSystemKey.String(st.l.key.system),
			semconv.MessagingDestinationName(st.l.key.queue))
		return append(attrs, AttrJobType.String(jobType))
	}
	return append(attrs, AttrJobType.String(o.jobLabel(jobType)))
}
