package sdk

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// HeaderDueAt carries the time a long-delayed message is due, RFC 3339 in
// UTC. [LongDelay] writes it; [Prepare] accepts it (the one reserved header
// an application's Publish may carry) when it holds a valid time.
const HeaderDueAt = "berth-due-at"

// HeaderHopOf carries, on each hop of a long-delayed message, the ID of the
// job's first message: the one [LongDelay.Publish] (or an application
// setting [HeaderDueAt] itself) published, whose ID the publisher knows the
// job by. A hop sets it to the ID of the delivery it continues when that has
// none, and keeps it otherwise, so every hop of a job names the same first
// message. The job-state ledger keys a hop's events by it, so a job is one
// row however many hops it takes. [Prepare] accepts it, non-empty, on a
// message whose [HeaderDueAt] it accepts.
const HeaderHopOf = "berth-hop-of"

func validDueAt(v string) bool {
	_, err := time.Parse(time.RFC3339Nano, v)
	return err == nil
}

// LongDelay delays messages beyond what a broker can delay at once (SQS: 15
// minutes at publish; RabbitMQ: its largest delay bucket; every broker:
// [MaxDelay]) by hops: its Publish sends a message whose Delay exceeds Limit
// with Delay = Limit and the due time in [HeaderDueAt]; its Middleware, on a
// delivery that is not yet due, publishes a copy to the same queue with the
// remaining delay (at most Limit again) and acks the delivery. The handler
// runs once the due time has passed. See ARCHITECTURE.md, "Delays beyond a
// broker's limit".
//
// Each hop is a new broker message with a new ID (a broker that drops a
// repeated ID, as JetStream does within its Duplicates window, would
// otherwise drop the hop), which names the job's first message in
// [HeaderHopOf]; it keeps the idempotency key — Publish fills an
// empty one with the message's ID, as a hop does for a message whose due
// header was set without Publish, so the hops stay one operation — the
// correlation ID and the application headers (not the brokers' berth-*
// bookkeeping). Attempts start again at 1 at each hop, and a hop never
// counts against the broker's delivery cap. A crash between a hop's publish
// and its ack leaves two copies, which the consumer's idempotency guard
// absorbs like any duplicate. Put the Middleware first in
// WorkerOptions.Middleware (outermost): a guard outside it would record the
// hop as the job's completion. Observers see each hop as an acked delivery
// of a message whose [HeaderDueAt] is after the delivery started: the
// ledger records it as the job waiting for that time, not as its
// completion.
//
// Not for the PostgreSQL broker with DedupeEnqueue (a hop's key is that of
// the stored job, so the hop would be dropped; PostgreSQL delays exactly up
// to [MaxDelay] without hops) nor SQS FIFO queues (no per-message delay).
type LongDelay struct {
	// Publisher sends the first publish and the hops.
	Publisher Publisher
	// Limit is the longest delay given to the broker at once: the broker's
	// limit (sqs.MaxPublishDelay, the largest RabbitMQ bucket) or less.
	Limit time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Unwrap returns l.Publisher, the publisher l sends through, so that layers
// naming the broker under a publisher (telemetry's messaging.system) look
// through LongDelay, as through the ledger's publisher or an [AsyncPool].
func (l LongDelay) Unwrap() Publisher { return l.Publisher }

func (l LongDelay) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

func (l LongDelay) check() error {
	if l.Publisher == nil || l.Limit <= 0 || l.Limit > MaxDelay {
		return fmt.Errorf("%w: LongDelay needs a Publisher and a Limit in (0, %s]", ErrInvalidMessage, MaxDelay)
	}
	return nil
}

// Publish publishes msgs through l.Publisher; a message whose Delay exceeds
// Limit (it may exceed [MaxDelay]) gets [HeaderDueAt] = now + Delay,
// Delay = Limit, and its ID as IdempotencyKey when it has none. It modifies
// msgs like any Publish.
func (l LongDelay) Publish(ctx context.Context, queue string, msgs ...*Message) error {
	if err := l.check(); err != nil {
		return err
	}
	now := l.now()
	for _, m := range msgs {
		if m != nil && m.Delay > l.Limit {
			if m.ID == "" {
				m.ID = NewID()
			}
			if m.IdempotencyKey == "" {
				m.IdempotencyKey = m.ID
			}
			m.SetHeader(HeaderDueAt, now.Add(m.Delay).UTC().Format(time.RFC3339Nano))
			m.Delay = l.Limit
		}
	}
	return l.Publisher.Publish(ctx, queue, msgs...)
}

// Middleware re-delays deliveries whose [HeaderDueAt] is still in the
// future and passes the others (no header, a due time passed, or one that
// does not parse) to the handler. A failed hop publish is returned as a
// transient error: the delivery is retried and hops then.
func (l LongDelay) Middleware() Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, d Delivery) error {
			m := d.Message()
			v := m.Header(HeaderDueAt)
			if v == "" {
				return next.Handle(ctx, d)
			}
			due, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return next.Handle(ctx, d)
			}
			remaining := due.Sub(l.now())
			if remaining <= 0 {
				return next.Handle(ctx, d)
			}
			if err := l.check(); err != nil {
				return err
			}
			hop := m.Clone()
			for k := range hop.Headers {
				// Broker bookkeeping (a retry's first failure, a redrive
				// count) is not the application's to publish.
				if IsReservedHeader(k) && k != HeaderDueAt && k != HeaderHopOf {
					delete(hop.Headers, k)
				}
			}
			if hop.IdempotencyKey == "" {
				// A due header set without LongDelay.Publish, which keys
				// the message: the hops must still be one operation, or
				// the copies a crash leaves could not be told apart.
				hop.IdempotencyKey = m.ID
			}
			if hop.Header(HeaderHopOf) == "" {
				// The first hop: the delivery is the job's first message,
				// whose ID the job is known by (the ledger's row).
				hop.SetHeader(HeaderHopOf, m.ID)
			}
			hop.ID = NewID()
			hop.Delay = min(remaining, l.Limit)
			if err := l.Publisher.Publish(ctx, d.Queue(), hop); err != nil {
				return fmt.Errorf("berth: long delay hop: %w", err)
			}
			if n, ok := ctx.Value(hopNoticeKey{}).(*atomic.Bool); ok {
				n.Store(true)
			}
			return nil
		})
	}
}

// hopNoticeKey holds, in a handler's context, the flag [WithHopNotice]
// made.
type hopNoticeKey struct{}

// WithHopNotice returns ctx with a notice that [LongDelay.Middleware] sets
// when it hops the delivery handled under it (republishes it for later and
// returns nil without running the handler), and hopped, which reports
// whether it did. It is for an [Observer] that must tell a hop's ack from
// the job's success: its Start returns the context, the Worker hands it to
// the handler, and its Settled asks hopped. The middleware decides on its
// own clock reading, so an observer comparing [HeaderDueAt] with its own
// would misread a due time passing between the two readings.
func WithHopNotice(ctx context.Context) (context.Context, func() bool) {
	n := new(atomic.Bool)
	return context.WithValue(ctx, hopNoticeKey{}, n), n.Load
}
