// Package memory is berth's embedded broker: queues held in the process's
// memory with the full semantics of the [sdk.Delivery] contract — leases
// (visibility timeouts) with fenced settlement, attempts counted across
// retries and expired leases, delayed publish and Retry(d), a dead-letter
// queue per queue with list, redrive and purge, statistics, and a cap on
// deliveries for poison messages.
//
// Ready messages are handed out in the order they became ready (published,
// or their delay, retry delay or lease ran out): messages published together
// reach a single receiver in publish order, whatever their Key, also when
// they carry the same Delay. Messages received together whose leases then
// run out come back in no set order.
//
// It is the default for tests, examples and single-process applications.
// Nothing survives the process: use a real broker when jobs must outlive it.
//
// The broker runs no goroutine of its own. Delays and leases are kept in
// heaps and acted upon lazily, by the calls that look at a queue (Publish,
// Receive, Stats, ExtendLease, the dead-letter calls, and a Retry or Release
// without delay); a Receive waiting on an empty queue sleeps
// on one timer set for the next due delay or lease end and is woken by
// Publish and by settlements that make a message ready.
package memory

import (
	"bytes"
	"container/heap"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthq/berth/sdk"
)

// Defaults of [Options].
const (
	DefaultLease          = 30 * time.Second
	DefaultMaxDeliveries  = 25
	DefaultMaxMessageSize = 1 << 20
)

// Options configures a [Broker]. The zero value is a sensible broker.
type Options struct {
	// Lease is how long a delivery is leased to its receiver before the
	// message is delivered again. Default 30s ([DefaultLease]).
	Lease time.Duration
	// MaxDeliveries caps the deliveries of a message (first delivery,
	// retries and expired leases all count; Release does not): a message whose
	// last allowed lease runs out, or which is retried at the cap, is
	// dead-lettered (at the Retry, not at a later Receive) with cause
	// [sdk.ErrMaxDeliveries] and the last Retry's cause. Keep it
	// above the Worker's MaxAttempts. 0 means [DefaultMaxDeliveries];
	// negative disables the cap.
	MaxDeliveries int
	// MaxMessageSize is the largest [sdk.Message.Size] Publish accepts. 0
	// means [DefaultMaxMessageSize] (1 MiB); negative means no limit.
	MaxMessageSize int
	// MaxBacklog bounds the messages each queue holds waiting for a
	// receiver (ready or delayed), as a buffered channel bounds its
	// buffer: a Publish that would take the queue past it waits until
	// receivers have taken enough, and a producer faster than its
	// consumers is held back instead of filling the process's memory. A
	// Publish of more messages than MaxBacklog goes in, whole, once the
	// queue holds none waiting. Waiting Publish calls go in in the order
	// they began to wait: a later one, even one that would fit, never goes
	// in ahead of an earlier one. A Publish whose context ends, or whose
	// broker closes, while it waits stores nothing and says so (the
	// context's error, [sdk.ErrClosed]). Messages that come back — a Retry,
	// a Release, an expired lease, a redrive — never wait and may take the
	// backlog past the bound; leased messages do not count. As with a
	// channel, a handler that publishes to its own full queue waits for
	// another handler to make room: give such a Publish a deadline, or keep
	// the bound above what the handlers publish at once. 0 (the default)
	// means no bound.
	MaxBacklog int
}

// Broker is an in-memory broker. It implements [sdk.Broker],
// [sdk.QueueDeclarer], [sdk.Inspector] and [sdk.DeadLetters]; its deliveries
// implement [sdk.Delivery] and [sdk.Releaser]. All its methods may be called
// concurrently. After Close every method but Close, and every settlement or
// ExtendLease of a delivery, returns [sdk.ErrClosed].
//
// Queues exist from their first use (a Publish of at least one message,
// Receive or DeclareQueue); a Publish of no message creates nothing, as on
// the other brokers.
// Each queue's dead-letter queue is kept with it and is reached through the
// [sdk.DeadLetters] methods with the queue's own name.
type Broker struct {
	lease          time.Duration
	maxDeliveries  int
	maxMessageSize int
	maxBacklog     int

	queues   sync.Map // name -> *queue
	closed   atomic.Bool
	closeMu  sync.Mutex
	closedCh chan struct{}
}

// Interfaces the broker and its deliveries implement.
var (
	_ sdk.Broker              = (*Broker)(nil)
	_ sdk.QueueDeclarer       = (*Broker)(nil)
	_ sdk.Inspector           = (*Broker)(nil)
	_ sdk.DeadLetters         = (*Broker)(nil)
	_ sdk.LeaseReporter       = (*Broker)(nil)
	_ sdk.DeliveryCapReporter = (*Broker)(nil)
	_ sdk.Delivery            = (*delivery)(nil)
	_ sdk.Releaser            = (*delivery)(nil)
)

// New returns an empty broker configured by opts.
func New(opts Options) (*Broker, error) {
	if opts.Lease < 0 {
		return nil, fmt.Errorf("memory: negative Lease %s", opts.Lease)
	}
	if opts.MaxBacklog < 0 {
		return nil, fmt.Errorf("memory: negative MaxBacklog %d", opts.MaxBacklog)
	}
	if opts.Lease == 0 {
		opts.Lease = DefaultLease
	}
	if opts.MaxDeliveries == 0 {
		opts.MaxDeliveries = DefaultMaxDeliveries
	}
	if opts.MaxMessageSize == 0 {
		opts.MaxMessageSize = DefaultMaxMessageSize
	}
	return &Broker{
		lease:          opts.Lease,
		maxDeliveries:  opts.MaxDeliveries,
		maxMessageSize: opts.MaxMessageSize,
		maxBacklog:     opts.MaxBacklog,
		closedCh:       make(chan struct{}),
	}, nil
}

// queue returns the queue named name, creating it.
func (b *Broker) queue(name string) *queue {
	if q, ok := b.queues.Load(name); ok {
		return q.(*queue)
	}
	q, _ := b.queues.LoadOrStore(name, &queue{name: name})
	return q.(*queue)
}

// existing returns the queue named name, or nil if it was never used.
func (b *Broker) existing(name string) *queue {
	if q, ok := b.queues.Load(name); ok {
		return q.(*queue)
	}
	return nil
}

// DeclareQueue creates queue if it does not exist. It is idempotent.
func (b *Broker) DeclareQueue(_ context.Context, queue string) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return err
	}
	b.queue(queue)
	return nil
}

// Publish validates msgs with [sdk.PrepareAll] (filling IDs and correlation
// IDs in place) and, when all pass, stores copies of them: the caller may
// reuse msgs afterwards. Nothing is stored when any message fails. Messages
// with a Delay become deliverable once it has passed. With ctx already done
// it stores nothing and returns ctx.Err(), as the network brokers do. Under
// [Options.MaxBacklog] it may wait for room; if ctx ends, or the broker
// closes, while it waits, it stores nothing and returns an error wrapping
// ctx.Err(), or [sdk.ErrClosed]. With no message it only validates the
// queue name: it does not create the queue.
func (b *Broker) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return sdk.ValidateQueueName(queue)
	}
	if err := sdk.PrepareAll(ctx, queue, msgs, b.maxMessageSize); err != nil {
		return err // it validates the queue name too
	}
	// One allocation for the entries and one for all bodies of the batch
	// (entry.shared), except the body of a message with a Delay in a batch
	// of several: it waits out its delay apart from the rest (store).
	batch := len(msgs) > 1
	entries := make([]entry, len(msgs))
	size := 0
	for _, m := range msgs {
		if !batch || m.Delay <= 0 {
			size += len(m.Body)
		}
	}
	var bodies []byte
	if size > 0 {
		bodies = make([]byte, 0, size)
	}
	for i, m := range msgs {
		e := &entries[i]
		e.msg = *m
		e.shared = batch
		if m.Body != nil {
			if batch && m.Delay > 0 {
				e.msg.Body = bytes.Clone(m.Body)
			} else {
				start := len(bodies)
				bodies = append(bodies, m.Body...)
				e.msg.Body = bodies[start:len(bodies):len(bodies)]
			}
		}
		if m.Headers != nil {
			h := make(map[string]string, len(m.Headers))
			for k, v := range m.Headers {
				h[k] = v
			}
			e.msg.Headers = h
		}
	}
	q := b.queue(queue)
	q.mu.Lock()
	defer q.mu.Unlock()
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	now := time.Now()
	q.promote(now, b.maxDeliveries) // what is due goes ahead of what is published now
	if len(q.waiters) > 0 {
		q.admit(b.maxBacklog, now) // waiters whose context ended are passed over
	}
	if len(q.waiters) == 0 && q.fits(b.maxBacklog, len(entries)) {
		q.store(entries, now)
		return nil
	}
	// Wait for room, behind the Publish calls already waiting: a Receive
	// that makes room stores the batch (admit).
	w := &waiter{ctx: ctx, entries: entries, in: make(chan struct{})}
	q.waiters = append(q.waiters, w)
	q.mu.Unlock()
	select {
	case <-w.in:
	case <-ctx.Done():
	case <-b.closedCh:
	}
	q.mu.Lock() // for the deferred Unlock
	if w.stored {
		return nil
	}
	if i := slices.Index(q.waiters, w); i >= 0 {
		q.waiters = slices.Delete(q.waiters, i, i+1)
		now = time.Now()
		if !b.closed.Load() {
			q.promote(now, b.maxDeliveries)
			q.admit(b.maxBacklog, now) // those behind w may fit
		}
	}
	if err := ctx.Err(); err != nil {
		return b.backlogWaitError(len(entries), queue, err)
	}
	return sdk.ErrClosed
}

// backlogWaitError is the error of a Publish of n messages to queue whose
// context ended (err) while it waited for room (Options.MaxBacklog).
func (b *Broker) backlogWaitError(n int, queue string, err error) error {
	return fmt.Errorf("memory: publish of %d to queue %q waited for room in its backlog (MaxBacklog %d): %w",
		n, queue, b.maxBacklog, err)
}

// Receive leases up to n (at least 1) ready messages of queue to the
// caller, waiting while there are none. It returns ctx.Err() when ctx is
// done first and [sdk.ErrClosed] when the broker is closed, also while it
// waits. The deliveries' messages are shared: callers must not modify them.
func (b *Broker) Receive(ctx context.Context, queue string, n int) ([]sdk.Delivery, error) {
	if b.closed.Load() {
		return nil, sdk.ErrClosed
	}
	q := b.existing(queue) // an existing queue's name was validated when it was made
	if q == nil {
		if err := sdk.ValidateQueueName(queue); err != nil {
			return nil, err
		}
		q = b.queue(queue)
	}
	n = max(n, 1)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if b.closed.Load() {
			return nil, sdk.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		q.mu.Lock()
		now := time.Now()
		q.promote(now, b.maxDeliveries)
		if q.ready.len() > 0 {
			ds := b.take(q, n, now)
			q.mu.Unlock()
			if len(ds) > 0 {
				return ds, nil
			}
			continue // all over the cap: look again
		}
		if q.wake == nil {
			q.wake = make(chan struct{})
		}
		wake := q.wake
		next, ok := q.nextDeadline()
		q.wakeAt, q.hasWakeAt = next, ok
		q.mu.Unlock()

		var fire <-chan time.Time
		if ok {
			d := next.Sub(now)
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			fire = timer.C
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-b.closedCh:
			return nil, sdk.ErrClosed
		case <-wake:
		case <-fire:
		}
	}
}

// take leases up to limit ready entries of q. q.mu is held.
func (b *Broker) take(q *queue, limit int, now time.Time) []sdk.Delivery {
	n := min(limit, q.ready.len())
	ds := make([]delivery, n)
	out := make([]sdk.Delivery, 0, n)
	until := now.Add(b.lease)
	for q.ready.len() > 0 && len(out) < n {
		e := q.ready.pop()
		if b.maxDeliveries > 0 && int(e.attempts) >= b.maxDeliveries {
			q.deadLetter(e, e.poison(), now)
			continue
		}
		e.attempts++
		e.gen++
		e.state = stateInFlight
		e.due = until
		heap.Push(&q.inFlight, e)
		d := &ds[len(out)]
		*d = delivery{b: b, q: q, e: e, gen: e.gen, attempt: int(e.attempts)}
		out = append(out, d)
	}
	if len(out) > 0 {
		q.deadlineMoved(until)
	}
	if len(q.waiters) > 0 && !b.closed.Load() {
		q.admit(b.maxBacklog, now)
	}
	return out
}

// Stats reports the queue's counts. OldestAge is the time since the oldest
// ready message became ready (was published, or its delay, retry delay or
// lease ran out). A queue never declared nor used gives an error wrapping
// [sdk.ErrNotFound], as on every broker.
func (b *Broker) Stats(_ context.Context, queue string) (sdk.QueueStats, error) {
	if b.closed.Load() {
		return sdk.QueueStats{}, sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return sdk.QueueStats{}, err
	}
	s := sdk.QueueStats{Queue: queue}
	q := b.existing(queue)
	if q == nil {
		return s, fmt.Errorf("memory: stats of queue %q, never declared nor used: %w", queue, sdk.ErrNotFound)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	q.promote(now, b.maxDeliveries)
	s.Ready = int64(q.ready.len())
	s.Delayed = int64(len(q.delayed))
	s.InFlight = int64(len(q.inFlight))
	s.DeadLettered = int64(len(q.dead))
	if q.ready.len() > 0 {
		s.OldestAge = max(time.Duration(sinceEpoch(now)-q.ready.peek().readySince), 0)
	}
	return s, nil
}

// Close closes the broker. Every later call returns [sdk.ErrClosed], and
// Receive calls, and Publish calls waiting for room (Options.MaxBacklog),
// waiting at the time return it. The messages are dropped.
// Close is safe to call more than once.
func (b *Broker) Close() error {
	b.closeMu.Lock()
	defer b.closeMu.Unlock()
	if b.closed.Swap(true) {
		return nil
	}
	close(b.closedCh)
	return nil
}

// Lease returns the lease every delivery gets ([sdk.LeaseReporter]): a Worker
// on this broker takes it as its default lease.
func (b *Broker) Lease() time.Duration { return b.lease }

// MaxDeliveries returns the poison cap (Options.MaxDeliveries; 0 when
// disabled) as [sdk.DeliveryCapReporter]: a Worker whose MaxAttempts is
// above it is warned about (or refused), and dead-letters at it itself so the
// dead letter keeps the handler's error.
func (b *Broker) MaxDeliveries() int { return max(b.maxDeliveries, 0) }
