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
// entry out of the in-flight heap itself.
func (d *delivery) settle(f func(q *queue, e *entry, now time.Time)) error {
	if d.b.closed.Load() {
		return sdk.ErrClosed
	}
	q := d.q
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	if err := d.check(now); err != nil {
		return err
	}
	d.settled = true
	heap.Remove(&q.inFlight, d.e.index)
	f(q, d.e, now)
	return nil
}

// check reports whether d may still be settled. q.mu is held.
func (d *delivery) check(now time.Time) error {
	if d.settled {
		return sdk.ErrAlreadySettled
	}
	e := d.e
	if e.gen != d.gen || e.state != stateInFlight {
		return leaseLost(d)
	}
	if !e.due.After(now) { // expired, not yet noticed by promote
		d.q.promote(now, d.b.maxDeliveries)
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
	return "memory: lease of message " + e.id + " (attempt " + itoa(e.attempt) + ") lost"
}

func (e *leaseLostError) Unwrap() error { return sdk.ErrLeaseLost }

// Ack removes the message.
func (d *delivery) Ack(context.Context) error {
	return d.settle(func(q *queue, e *entry, _ time.Time) {
		e.state = stateGone
		e.gen++
	})
}

// Retry makes the message deliverable again after delay (clamped to [0,
// sdk.MaxDelay]), counting an attempt. cause is not stored, but its time is:
// the first failure time is carried to the dead-letter headers.
func (d *delivery) Retry(_ context.Context, delay time.Duration, _ error) error {
	return d.settle(func(q *queue, e *entry, now time.Time) {
		if e.firstFailure.IsZero() {
			e.firstFailure = now
		}
		d.requeue(q, e, now, delay)
	})
}

// Release hands the message back without consuming an attempt: the next
// delivery has the same Attempt. It becomes deliverable after delay.
func (d *delivery) Release(_ context.Context, delay time.Duration) error {
	return d.settle(func(q *queue, e *entry, now time.Time) {
		e.attempts--
		d.requeue(q, e, now, delay)
	})
}

func (d *delivery) requeue(q *queue, e *entry, now time.Time, delay time.Duration) {
	e.gen++
	delay = min(delay, sdk.MaxDelay)
	if delay > 0 {
		q.schedule(e, now.Add(delay))
		return
	}
	q.makeReady(e, now)
}

// DeadLetter moves the message to the queue's dead-letter queue with the
// reason headers of [sdk.AnnotateDeadLetter].
func (d *delivery) DeadLetter(_ context.Context, cause error) error {
	return d.settle(func(q *queue, e *entry, now time.Time) {
		q.deadLetter(e, cause, now)
	})
}

// ExtendLease moves the end of the lease to d from now (the broker's lease
// when d <= 0). It returns an error wrapping [sdk.ErrLeaseLost] when the
// lease already ended and [sdk.ErrAlreadySettled] after a settlement.
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
	if err := d.check(now); err != nil {
		return err
	}
	d.e.due = now.Add(by)
	heap.Fix(&q.inFlight, d.e.index)
	return nil
}
