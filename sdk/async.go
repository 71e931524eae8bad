package sdk

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// PublishResult is the outcome of one asynchronous publish: it resolves once,
// when the broker has durably accepted the message (Err returns nil) or has
// failed it (Err returns the cause, classified like a [Publisher.Publish]
// error: [ErrUnavailable] to retry, [ErrClosed], [ErrNotFound], ...).
//
// Every PublishResult handed out resolves, also when the publisher closes
// (with an error wrapping [ErrClosed] or [ErrUnavailable]).
type PublishResult struct {
	id       string
	done     chan struct{}
	err      error
	resolved atomic.Bool

	mu    sync.Mutex
	fired bool          // the callbacks ran (or are running); later ones run at once
	after []func(error) // AfterResolve's callbacks, waiting for Resolve
}

// NewPublishResult returns an unresolved result for the message with id.
// Brokers implementing [AsyncPublisher] create it; applications do not.
func NewPublishResult(id string) *PublishResult {
	return &PublishResult{id: id, done: make(chan struct{})}
}

// ID is the published message's ID.
func (r *PublishResult) ID() string { return r.id }

// Done is closed when the result is resolved.
func (r *PublishResult) Done() <-chan struct{} { return r.done }

// Err returns the outcome once Done is closed, and nil before.
func (r *PublishResult) Err() error {
	select {
	case <-r.done:
		return r.err
	default:
		return nil
	}
}

// Wait waits for the outcome. When ctx ends first it returns ctx.Err(): the
// message may still be published (the result resolves later).
func (r *PublishResult) Wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	default:
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Resolve settles the result with err (nil: published). Only the first call
// counts; it reports whether it was that one. Brokers call it.
func (r *PublishResult) Resolve(err error) bool {
	if !r.resolved.CompareAndSwap(false, true) {
		return false
	}
	r.err = err
	close(r.done)
	r.mu.Lock()
	r.fired = true
	after := r.after
	r.after = nil
	r.mu.Unlock()
	for _, fn := range after {
		fn(err)
	}
	return true
}

// AfterResolve arranges for fn to be called with the outcome (nil:
// published) once r resolves: on the goroutine that resolves it, after Done
// is closed, or at once on the caller's when r has already resolved. fn
// runs on the broker's confirmation path: it must be quick and must not
// block. It lets a wrapper of an [AsyncPublisher] act on each outcome (and
// resolve a result of its own after it) without a goroutine per message.
func (r *PublishResult) AfterResolve(fn func(err error)) {
	r.mu.Lock()
	if !r.fired {
		r.after = append(r.after, fn)
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	<-r.done // fired is set after done closes and err is written
	fn(r.err)
}

// AsyncPublisher is implemented by publishers that keep many messages in
// flight for one caller: PublishAsync hands msg to the broker and returns
// without waiting for its confirmation, which the returned result carries.
//
// PublishAsync prepares msg like Publish ([Prepare]: ID, correlation ID,
// checks); a message that fails validation returns the error and nothing is
// published. It blocks while the publisher's bound of unconfirmed messages
// is reached (back-pressure), returning ctx.Err() if ctx ends first; with
// ctx already done it publishes nothing and returns ctx.Err(). Once it has
// returned a result, the message is the broker's: cancelling ctx afterwards
// may fail the result (the message was then perhaps published, like a
// Publish cut short) but never leaves it unresolved. msg is not retained
// after the result resolves, and must not be modified before. It may be
// called concurrently, and results resolve in any order. Whether messages
// reach the queue in call order is the implementation's to say (RabbitMQ's
// does for one caller; [AsyncPool]'s batching fallback does only with one
// sender). After Close it returns [ErrClosed].
type AsyncPublisher interface {
	PublishAsync(ctx context.Context, queue string, msg *Message) (*PublishResult, error)
}

// AsyncOptions configures [NewAsyncPublisher].
type AsyncOptions struct {
	// MaxInFlight bounds the messages accepted and not yet resolved;
	// PublishAsync blocks beyond it. Default 256.
	MaxInFlight int
	// MaxBatch bounds the messages one Publish call of the generic fallback
	// carries. Default 100.
	MaxBatch int
	// Senders is the number of concurrent Publish calls of the generic
	// fallback. Default 4.
	Senders int
	// Linger is how long the generic fallback waits for a batch to fill
	// before sending it. Default 0: a batch leaves as soon as a sender is
	// free, so batches form only while every sender is busy (group commit,
	// no added latency when idle).
	Linger time.Duration
}

// AsyncPool is an [AsyncPublisher] over any [Publisher]. When the publisher
// implements AsyncPublisher natively, the pool hands every call to it (the
// broker bounds its own in-flight messages, and AsyncOptions are unused);
// otherwise it gathers concurrent PublishAsync calls into batched Publish
// calls (one queue per call) made by a bounded set of sender goroutines that
// the pool owns: a PostgreSQL broker then inserts a batch in one transaction
// and SQS sends it with SendMessageBatch.
//
// A batched Publish runs under the context of its first message's call,
// not each message's own: a publisher that reads the context per message
// (a tracing wrapper, such as package telemetry's, parenting each
// message's span and trace headers) belongs outside the pool —
// tel.Publisher(sdk.NewAsyncPublisher(broker)), whose PublishAsync stamps
// each message under its own caller's context before the pool batches it.
// Inside the pool, every message of a batch joined the first caller's
// trace.
//
// Close waits for every accepted message to resolve; call it when done, as
// the fallback's sender goroutines run until then.
type AsyncPool struct {
	pub    Publisher
	native AsyncPublisher
	opts   AsyncOptions
	sem    chan struct{}

	mu      sync.Mutex
	queues  map[string][]asyncItem
	order   []string // queues with waiting items, oldest first
	wake    chan struct{}
	closed  bool
	stop    chan struct{}
	senders sync.WaitGroup
	flight  sync.WaitGroup
}

type asyncItem struct {
	ctx context.Context
	msg *Message
	res *PublishResult
}

// Unwrap returns the Publisher the pool publishes through, so that its
// optional interfaces ([Inspector], [DeadLetters], …) and its name (a
// telemetry label) stay reachable through the pool.
func (p *AsyncPool) Unwrap() Publisher { return p.pub }

// NewAsyncPublisher returns an AsyncPool publishing through p.
func NewAsyncPublisher(p Publisher, opts AsyncOptions) *AsyncPool {
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 256
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 100
	}
	if opts.Senders <= 0 {
		opts.Senders = 4
	}
	a := &AsyncPool{pub: p, opts: opts, sem: make(chan struct{}, opts.MaxInFlight), stop: make(chan struct{})}
	if n, ok := p.(AsyncPublisher); ok {
		a.native = n
		return a
	}
	a.queues = map[string][]asyncItem{}
	a.wake = make(chan struct{}, 1)
	a.senders.Add(opts.Senders)
	for range opts.Senders {
		go a.sender()
	}
	return a
}

// PublishAsync implements [AsyncPublisher]. Without a native implementation
// it validates msg with [Prepare] (without the broker's size limit, which
// the batch's Publish checks: an oversized message fails its own result).
func (a *AsyncPool) PublishAsync(ctx context.Context, queue string, msg *Message) (*PublishResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	closed := a.closed
	if a.native != nil {
		a.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		return a.native.PublishAsync(ctx, queue, msg)
	}
	if !closed {
		a.flight.Add(1)
	}
	a.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	select {
	case a.sem <- struct{}{}:
	case <-ctx.Done():
		a.flight.Done()
		return nil, ctx.Err()
	}
	if err := Prepare(ctx, queue, msg, 0); err != nil {
		<-a.sem
		a.flight.Done()
		return nil, err
	}
	res := NewPublishResult(msg.ID)
	a.mu.Lock()
	if len(a.queues[queue]) == 0 {
		a.order = append(a.order, queue)
	}
	a.queues[queue] = append(a.queues[queue], asyncItem{ctx: ctx, msg: msg, res: res})
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return res, nil
}

// take removes the next batch: up to MaxBatch items of the oldest waiting
// queue.
func (a *AsyncPool) take() (string, []asyncItem) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.order) == 0 {
		return "", nil
	}
	q := a.order[0]
	items := a.queues[q]
	n := min(len(items), a.opts.MaxBatch)
	batch := items[:n:n]
	if n == len(items) {
		delete(a.queues, q)
		a.order = a.order[1:]
	} else {
		a.queues[q] = items[n:]
		a.order = append(a.order[1:], q) // the other queues' turn
	}
	if len(a.order) > 0 {
		select { // more work: wake another sender
		case a.wake <- struct{}{}:
		default:
		}
	}
	return q, batch
}

func (a *AsyncPool) sender() {
	defer a.senders.Done()
	for {
		q, batch := a.take()
		if batch == nil {
			select {
			case <-a.wake:
				continue
			case <-a.stop:
				// Close waited for every accepted item: nothing is left.
				return
			}
		}
		if a.opts.Linger > 0 && len(batch) < a.opts.MaxBatch {
			a.lingerFill(q, &batch)
		}
		a.send(q, batch)
		for range batch {
			<-a.sem
			a.flight.Done()
		}
	}
}

// lingerFill waits up to Linger for more items of q.
func (a *AsyncPool) lingerFill(q string, batch *[]asyncItem) {
	t := time.NewTimer(a.opts.Linger)
	defer t.Stop()
	<-t.C
	a.mu.Lock()
	defer a.mu.Unlock()
	items := a.queues[q]
	n := min(len(items), a.opts.MaxBatch-len(*batch))
	if n == 0 {
		return
	}
	*batch = append(*batch, items[:n]...)
	if n == len(items) {
		delete(a.queues, q)
		for i, o := range a.order {
			if o == q {
				a.order = append(a.order[:i], a.order[i+1:]...)
				break
			}
		}
	} else {
		a.queues[q] = items[n:]
	}
}

// send publishes batch in one call and resolves every result. Items whose
// ctx ended while they waited fail with ctx's error, unpublished. A call
// refused as a whole (a message failed the broker's validation) is retried
// message by message so that only the bad message fails.
func (a *AsyncPool) send(q string, batch []asyncItem) {
	live := batch[:0:0]
	for _, it := range batch {
		if err := it.ctx.Err(); err != nil {
			it.res.Resolve(err)
			continue
		}
		live = append(live, it)
	}
	if len(live) == 0 {
		return
	}
	// The call outlives any one caller's ctx, keeps the first caller's
	// values (tracing) and ends when every caller has given up.
	ctx, cancel := batchContext(live)
	defer cancel()
	msgs := make([]*Message, len(live))
	for i, it := range live {
		msgs[i] = it.msg
	}
	err := a.pub.Publish(ctx, q, msgs...)
	var pe *PublishError
	switch {
	case err == nil:
		for _, it := range live {
			it.res.Resolve(nil)
		}
	case errors.As(err, &pe):
		for _, it := range live {
			it.res.Resolve(pe.Failed[it.msg.ID]) // nil: accepted
		}
	case len(live) > 1 && !errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrClosed) && ctx.Err() == nil:
		for _, it := range live {
			it.res.Resolve(a.pub.Publish(it.ctx, q, it.msg))
		}
	default:
		for _, it := range live {
			it.res.Resolve(err)
		}
	}
}

// batchContext returns a context carrying the first item's values that is
// cancelled once every item's ctx is done.
func batchContext(items []asyncItem) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(items[0].ctx))
	var left atomic.Int64
	left.Store(int64(len(items)))
	stops := make([]func() bool, 0, len(items))
	for _, it := range items {
		stops = append(stops, context.AfterFunc(it.ctx, func() {
			if left.Add(-1) == 0 {
				cancel(fmt.Errorf("berth: every caller of the batch gave up: %w", context.Cause(it.ctx)))
			}
		}))
	}
	return ctx, func() {
		for _, s := range stops {
			s()
		}
		cancel(context.Canceled)
	}
}

// Publish publishes msgs through the underlying publisher and waits, as
// [Publisher.Publish] does: the pool is a Publisher too, so that code taking
// a Publisher (the outbox relay) can use its PublishAsync. It does not go
// through the pool's batching or its in-flight bound.
func (a *AsyncPool) Publish(ctx context.Context, queue string, msgs ...*Message) error {
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return a.pub.Publish(ctx, queue, msgs...)
}

// Close stops accepting messages (PublishAsync returns [ErrClosed]), waits
// until every accepted message has resolved, and stops the senders. Over a
// native AsyncPublisher it only stops accepting: the results already handed
// out resolve as the broker confirms. It does
// not close the underlying publisher. Later calls return nil.
func (a *AsyncPool) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.mu.Unlock()
	a.flight.Wait()
	close(a.stop)
	a.senders.Wait()
	return nil
}
