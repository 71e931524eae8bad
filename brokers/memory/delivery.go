package memory

import (
	"container/heap"
	"context"
	"time"

	"github.com/berthq/berth/sdk"
)

// delivery is one lease of a message. gen fences it: once the entry's gen
// moved on (the lease expired, or another delivery settled it), settling
// this delivery returns [sdk.ErrLeaseLost].
type delivery struct {
	b       *Broker
	q       *queue
	e       *entry
	gen     uint64
	attempt int
	settled bool // guarded by q.mu
}

// Message returns the delivered message, shared with the broker: do not modify it.
func (d *delivery) Message() *sdk.Message { return &d.e.msg }

// Attempt is 1 on the first delivery and counts retries and expired leases.
func (d *delivery) Attempt() int { return d.attempt }

// Queue is the queue the delivery came from.
func (d *delivery) Queue() string { return d.q.name }

// settle runs f with the queue locked if d still holds its lease. f takes the
// entry out of the in-flight heap itself. needNow says whether f uses the
// clock: reading it costs more than the rest of an Ack.
//
// A lease whose time ran out but whose message was not yet handed to anyone
// else still settles: no other consumer can hold it, and the Ack of a slow
// but successful handler is not thrown away. Once the broker noticed the
// expiry (at the next call that looks at the queue: see the package doc),
// settling returns ErrLeaseLost.
func (d *delivery) settle(needNow bool, f func(q *queue, e *entry, now time.Time)) error {
	if d.b.closed.Load() {
		return sdk.ErrClosed
	}
	q := d.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := d.check(); err != nil {
		return err
	}
	var now time.Time
	if needNow {
		now = time.Now()
	}
	d.settled = true
	heap.Remove(&q.inFlight, int(d.e.index))
	f(q, d.e, now)
	return nil
}

// check reports whether d may still be settled. q.mu is held.
func (d *delivery) check() error {
	if d.settled {
		return sdk.ErrAlreadySettled
	}
	if e := d.e; e.gen != d.gen || e.state != stateInFlight {
		return leaseLost(d)
	}
	return nil
}

func leaseLost(d *delivery) error {
	return &leaseLostError{id: d.e.msg.ID, attempt: d.attempt}
}

// leaseLostError wraps sdk.ErrLeaseLost with the message and attempt.
type leaseLostError struct {
	id      string
	attempt int
}

func (e *leaseLostError) Error() string {
	return "memory: lease of message " + sdk.ErrorText(e.id) + " (attempt " + itoa(e.attempt) + ") lost"
}

func (e *leaseLostError) Unwrap() error { return sdk.ErrLeaseLost }

// Ack removes the message.
func (d *delivery) Ack(context.Context) error {
	return d.settle(false, func(q *queue, e *entry, _ time.Time) {
		e.state = stateGone
		e.gen++
	})
}

// Retry makes the message deliverable again after delay (clamped to [0,
// sdk.MaxDelay]), counting an attempt. cause is kept (sanitised) for a
// poison dead letter's reason, and its time carried to the dead-letter
// headers as the first failure. At the last delivery the cap
// ([Options.MaxDeliveries]) allows, Retry dead-letters the message at once
// with cause [sdk.ErrMaxDeliveries] and cause in the reason.
func (d *delivery) Retry(_ context.Context, delay time.Duration, cause error) error {
	var own *entry
	if m := d.b.maxDeliveries; m <= 0 || d.attempt < m { // else it is dead-lettered (a copy)
		own = d.e.detached()
	}
	return d.settle(true, func(q *queue, e *entry, now time.Time) {
		if e.failed == nil {
			e.failed = &failure{first: now}
		}
		if cause != nil {
			e.failed.lastError = sdk.SanitizeReason(cause.Error())
		}
		d.requeue(q, e, own, now, delay)
	})
}

// Release hands the message back without consuming an attempt: the next
// delivery has the same Attempt. It becomes deliverable after delay.
func (d *delivery) Release(_ context.Context, delay time.Duration) error {
	own := d.e.detached()
	return d.settle(true, func(q *queue, e *entry, now time.Time) {
		e.attempts--
		d.requeue(q, e, own, now, delay)
	})
}

// requeue makes e deliverable again after delay, as own when not nil (e's
// message in an entry of its own, [entry.detached]: a message that comes
// back may stay long after the rest of its Publish batch). A message that
// used the last delivery the cap allows is dead-lettered now (its next
// delivery would pass the cap): left waiting for a Receive to notice, it
// would be missing from ListDeadLetters and Stats, counted Ready or
// Delayed, until a consumer came, and for ever on a queue whose consumers
// are gone.
func (d *delivery) requeue(q *queue, e, own *entry, now time.Time, delay time.Duration) {
	e.gen++
	if m := d.b.maxDeliveries; m > 0 && int(e.attempts) >= m {
		q.deadLetter(e, e.poison(), now)
		return
	}
	if own != nil { // e stays where it is, settled, for the deliveries that still point at it
		own.gen, own.failed, own.attempts = e.gen, e.failed, e.attempts
		e.state = stateGone
		e = own
	}
	delay = min(delay, sdk.MaxDelay)
	if delay > 0 {
		q.schedule(e, now.Add(delay))
		return
	}
	q.promote(now, d.b.maxDeliveries) // keep the ready FIFO ordered by readySince
	q.makeReady(e, now)
}

// DeadLetter moves the message to the queue's dead-letter queue with the
// reason headers of [sdk.AnnotateDeadLetter].
func (d *delivery) DeadLetter(_ context.Context, cause error) error {
	return d.settle(true, func(q *queue, e *entry, now time.Time) {
		q.deadLetter(e, cause, now)
	})
}

// ExtendLease moves the end of the lease to by from now (the broker's lease
// when by <= 0). It returns an error wrapping [sdk.ErrLeaseLost] when the
// lease already ended, and [sdk.ErrAlreadySettled] after a settlement.
func (d *delivery) ExtendLease(_ context.Context, by time.Duration) error {
	if d.b.closed.Load() {
		return sdk.ErrClosed
	}
	if by <= 0 {
		by = d.b.lease
	}
	q := d.q
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	q.promote(now, d.b.maxDeliveries) // a lease that ran out is not revived
	if err := d.check(); err != nil {
		return err
	}
	d.e.due = now.Add(by)
	heap.Fix(&q.inFlight, int(d.e.index))
	q.deadlineMoved(d.e.due) // a shortened lease: waiting receivers must wake for it
	return nil
}
