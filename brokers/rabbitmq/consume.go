package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// consumer consumes one queue on its own channel of the consuming
// connection and feeds the deliveries to Receive through out. It reopens
// the channel (and redeclares) when the channel or the connection dies.
type consumer struct {
	b     *Broker
	queue string
	out   chan *delivery // buffered to Prefetch

	prefetch int // basic.qos of its channels

	gone   chan struct{} // closed when the consumer stopped for good (err says why)
	err    error         // set before gone is closed
	exited chan struct{} // closed when run returns
}

// chanState is one consumer channel's life: deliveries hold it, and a
// settlement on a dead one reports [sdk.ErrLeaseLost].
type chanState struct {
	ch   *amqp.Channel
	dead chan struct{}
	once sync.Once

	mu      sync.Mutex
	unacked map[uint64]struct{} // tags handed out and not settled: AckBatch may ack with multiple below the lowest
}

// track records a delivery tag as handed out and unsettled.
func (s *chanState) track(tag uint64) {
	s.mu.Lock()
	if s.unacked == nil {
		s.unacked = make(map[uint64]struct{})
	}
	s.unacked[tag] = struct{}{}
	s.mu.Unlock()
}

// untrack records tags as settled.
func (s *chanState) untrack(tags ...uint64) {
	s.mu.Lock()
	for _, t := range tags {
		delete(s.unacked, t)
	}
	s.mu.Unlock()
}

func (s *chanState) kill() { s.once.Do(func() { close(s.dead) }) }

func (s *chanState) isDead() bool {
	select {
	case <-s.dead:
		return true
	default:
		return s.ch.IsClosed()
	}
}

// consumerFor returns the queue's consumer, starting it on first use with
// the prefetch of Options.Prefetch, else max (capped at DefaultPrefetch).
func (b *Broker) consumerFor(queue string, max int) (*consumer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed() {
		return nil, sdk.ErrClosed
	}
	c := b.consumers[queue]
	if c == nil {
		prefetch := b.opts.Prefetch
		if prefetch == 0 {
			prefetch = min(max, DefaultPrefetch)
		}
		c = &consumer{b: b, queue: queue, prefetch: prefetch, out: make(chan *delivery, prefetch),
			gone: make(chan struct{}), exited: make(chan struct{})}
		b.consumers[queue] = c
		b.wg.Add(1)
		go c.run()
	}
	return c, nil
}

func (c *consumer) run() {
	defer c.b.wg.Done()
	defer close(c.exited)
	log := c.b.opts.Logger.With("broker", "rabbitmq", "queue", c.queue)
	for attempt := 1; ; {
		err := c.session()
		if c.b.closed() {
			return
		}
		var ae *amqp.Error
		if c.b.opts.NoDeclare && errors.As(err, &ae) && ae.Code == amqp.NotFound {
			// With NoDeclare nothing here will create the queue: report it
			// to Receive instead of retrying the 404 for ever, and let the
			// next Receive start a new consumer (the queue may exist then).
			c.stop(fmt.Errorf("%w: rabbitmq: queue %q: %w", sdk.ErrNotFound, c.queue, err))
			return
		}
		if err == nil { // the channel ran and died: reopen after the shortest backoff
			attempt = 1
		} else {
			log.Warn("rabbitmq consumer", "attempt", attempt, "err", err)
			attempt++
		}
		t := time.NewTimer(c.b.backoff(attempt))
		select {
		case <-t.C:
		case <-c.b.closing:
			t.Stop()
			return
		}
	}
}

// session opens a channel, consumes until it dies, and returns nil when it
// delivered at least once before dying.
func (c *consumer) session() error {
	ctx, cancel := context.WithCancel(c.b.ctx)
	defer cancel()
	if err := c.b.ensure(ctx, c.queue); err != nil {
		return err
	}
	conn, err := c.b.con.get(ctx)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	st := &chanState{ch: ch, dead: make(chan struct{})}
	defer st.kill()
	if err := ch.Qos(c.prefetch, 0, false); err != nil {
		_ = ch.Close()
		return err
	}
	tag := "berth-" + sdk.NewID()
	dels, err := ch.ConsumeWithContext(ctx, c.queue, tag, false, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			c.b.forget(c.queue) // deleted behind our back: declare again next time
		}
		return err
	}
	for {
		select {
		case d, ok := <-dels:
			if !ok {
				// The channel died, or the server cancelled the consumer
				// (queue deleted, leader moved): close the channel so that
				// its unacked deliveries go back to the queue either way,
				// and declare the queue again before consuming again.
				if !ch.IsClosed() {
					c.b.forget(c.queue)
				}
				_ = ch.Close()
				return nil
			}
			dv := c.wrap(d, st)
			select {
			case c.out <- dv:
			case <-st.dead:
				return nil
			case <-c.b.closing:
				c.handBack(st, tag, dels, dv)
				_ = ch.Close()
				return nil
			}
		case <-st.dead: // abandoned
			_ = ch.Close()
			return nil
		case <-c.b.closing:
			c.handBack(st, tag, dels, nil)
			_ = ch.Close()
			return nil
		}
	}
}

// handBack, when Close begins, returns the deliveries of st that no
// Receive has returned (those waiting in out, pending, and those still
// arriving) without consuming an attempt: it cancels the consumer so that
// no more come, publishes a copy of each carrying its attempt, like
// Release, and acks the originals whose copies were confirmed. Requeueing
// them instead would count a delivery (see the package doc). Whatever it
// cannot hand back goes back when the channel closes.
func (c *consumer) handBack(st *chanState, tag string, dels <-chan amqp.Delivery, pending *delivery) {
	b := c.b
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.CloseTimeout)
	defer cancel()
	var unseen []*delivery
	take := func(d *delivery) {
		if d != nil && d.st == st && d.settled.CompareAndSwap(false, true) {
			unseen = append(unseen, d)
		}
	}
drain:
	for {
		select {
		case d := <-c.out:
			take(d)
		default:
			break drain
		}
	}
	take(pending)
	if err := st.ch.Cancel(tag, false); err != nil {
		return // the channel is gone: the server has requeued them already
	}
	// After basic.cancel-ok amqp091 hands over what it buffered and closes
	// dels.
	for d := range dels {
		take(c.wrap(d, st))
	}
	if len(unseen) == 0 {
		return
	}
	now := time.Now()
	out := make([]outgoing, len(unseen))
	for i, d := range unseen {
		out[i] = outgoing{id: d.msg.ID, key: c.queue, pub: encode(d.msg, d.attempt, now)}
	}
	err := b.sendAll(ctx, out)
	var pe *sdk.PublishError
	if err != nil && !errors.As(err, &pe) {
		return
	}
	for _, d := range unseen {
		if pe != nil && pe.Failed[d.msg.ID] != nil {
			continue
		}
		_ = st.ch.Ack(d.tag, false)
		st.untrack(d.tag)
	}
	// RabbitMQ 3.10 applies a quorum queue's acks asynchronously, and
	// closing the channel right after a run of single acks requeued some of
	// them (7 of 40, measured; a copy and a redelivered original then both
	// arrive). A short pause lets the server apply them (0 of 40 lost in
	// every measured run with 50ms).
	t := time.NewTimer(settleGrace)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// settleGrace is how long handBack waits between its acks and the channel
// close (see there).
const settleGrace = 100 * time.Millisecond

// stop ends the consumer for good with err: Receive returns err, and the
// next Receive of the queue starts a new consumer.
func (c *consumer) stop(err error) {
	c.b.mu.Lock()
	if c.b.consumers[c.queue] == c {
		delete(c.b.consumers, c.queue)
	}
	c.b.mu.Unlock()
	c.err = err
	close(c.gone)
}

func (c *consumer) wrap(d amqp.Delivery, st *chanState) *delivery {
	dec := decode(d.Headers, d.MessageId, d.Type, d.CorrelationId, d.Body)
	attempt := dec.base
	switch {
	case dec.deliveryCnt >= 0:
		attempt += dec.deliveryCnt
	case d.Redelivered:
		attempt++
	}
	st.track(d.DeliveryTag)
	return &delivery{c: c, st: st, tag: d.DeliveryTag, msg: dec.msg, attempt: attempt}
}

// Receive returns between 1 and max deliveries of queue, waiting without
// busy looping while it is empty; it returns ctx.Err() when ctx is done
// (already done: at once, taking nothing) and [sdk.ErrClosed] after Close.
// With [Options.NoDeclare], a queue that does not exist gives an error
// wrapping [sdk.ErrNotFound] and the server's *amqp.Error.
//
// The first Receive of a queue starts a consumer with [Options.Prefetch]
// (default: this call's max, at most [DefaultPrefetch]); it keeps running
// until Close, holding up to Prefetch messages for this process, and Close
// hands back those no Receive returned without consuming an attempt.
func (b *Broker) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	if max < 1 {
		return nil, fmt.Errorf("%w: rabbitmq: Receive max %d below 1", sdk.ErrInvalidMessage, max)
	}
	// Checked first: with a delivery waiting, the select below would pick
	// between it and ctx.Done() at random, and hand a delivery to a caller
	// that believes it got nothing.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := b.consumerFor(queue, max)
	if err != nil {
		return nil, err
	}
	var out []sdk.Delivery
	for len(out) == 0 {
		select {
		case d := <-c.out:
			if !d.st.isDead() {
				out = append(out, d)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-b.closing:
			return nil, sdk.ErrClosed
		case <-c.gone:
			return nil, c.err
		}
	}
	for len(out) < max {
		select {
		case d := <-c.out:
			if !d.st.isDead() {
				out = append(out, d)
			}
		default:
			return out, nil
		}
	}
	return out, nil
}

// delivery is one receipt of a message on a consumer channel.
type delivery struct {
	c       *consumer
	st      *chanState
	tag     uint64
	msg     *sdk.Message
	attempt int
	settled atomic.Bool
}

var _ sdk.Releaser = (*delivery)(nil)

func (d *delivery) Message() *sdk.Message { return d.msg }
func (d *delivery) Attempt() int          { return d.attempt }
func (d *delivery) Queue() string         { return d.c.queue }

// ExtendLease does nothing: RabbitMQ holds a delivery until it is settled
// or its channel closes; the server's consumer_timeout (30 minutes by
// default) bounds how long. It returns [sdk.ErrClosed] after Close (like
// the settlements), [sdk.ErrLeaseLost] when the channel is gone and
// [sdk.ErrAlreadySettled] after a settlement.
func (d *delivery) ExtendLease(ctx context.Context, _ time.Duration) error {
	if d.c.b.closed() {
		return sdk.ErrClosed
	}
	if d.settled.Load() {
		return sdk.ErrAlreadySettled
	}
	if d.st.isDead() {
		return d.lost()
	}
	return nil
}

func (d *delivery) lost() error {
	return fmt.Errorf("%w: rabbitmq: the channel of delivery %s closed; the server requeued it", sdk.ErrLeaseLost, d.msg.ID)
}

// begin claims the delivery's one settlement.
func (d *delivery) begin() error {
	if d.c.b.closed() {
		return sdk.ErrClosed
	}
	if !d.settled.CompareAndSwap(false, true) {
		return sdk.ErrAlreadySettled
	}
	if d.st.isDead() {
		return d.lost()
	}
	return nil
}

func (d *delivery) ack() error {
	defer d.st.untrack(d.tag)
	if err := d.st.ch.Ack(d.tag, false); err != nil {
		if d.st.isDead() || errors.Is(err, amqp.ErrClosed) {
			return d.lost()
		}
		return fmt.Errorf("rabbitmq: ack: %w", err)
	}
	return nil
}

// Ack removes the message (basic.ack).
func (d *delivery) Ack(ctx context.Context) error {
	if err := d.begin(); err != nil {
		return err
	}
	return d.ack()
}

// Retry publishes a copy with Attempt()+1 through the delay queue of the
// next bucket up from delay (or straight to the queue when delay is 0; the
// largest bucket when delay exceeds it), waits for its confirm, then acks
// this delivery. If the publish fails the
// delivery is requeued (basic.nack) and the error returned.
func (d *delivery) Retry(ctx context.Context, delay time.Duration, cause error) error {
	if err := d.begin(); err != nil {
		return err
	}
	m := d.msg.Clone()
	if m.Header(sdk.HeaderFirstFailure) == "" {
		m.SetHeader(sdk.HeaderFirstFailure, time.Now().UTC().Format(time.RFC3339Nano))
	}
	return d.republish(ctx, m, d.attempt+1, delay)
}

// Release hands the message back without consuming an attempt: a copy with
// the same Attempt() goes through the delay path like Retry, then this
// delivery is acked.
func (d *delivery) Release(ctx context.Context, delay time.Duration) error {
	if err := d.begin(); err != nil {
		return err
	}
	return d.republish(ctx, d.msg.Clone(), d.attempt, delay)
}

func (d *delivery) republish(ctx context.Context, m *sdk.Message, attempt int, delay time.Duration) error {
	b := d.c.b
	if delay < 0 {
		delay = 0
	}
	if delay > sdk.MaxDelay {
		delay = sdk.MaxDelay
	}
	key := d.c.queue
	if delay > 0 {
		q, err := b.ensureDelay(ctx, d.c.queue, delay)
		if err != nil {
			return d.requeue(err)
		}
		key = q
	}
	out := []outgoing{{id: m.ID, key: key, pub: encode(m, attempt, time.Now())}}
	if err := b.sendAll(ctx, out); err != nil {
		b.forgetUnroutable(err, key)
		return d.requeue(err)
	}
	return d.ack()
}

// DeadLetter publishes a copy annotated with the reason headers
// ([sdk.AnnotateDeadLetter]) to the dead-letter exchange, which routes it
// to "<queue>.dlq", waits for the confirm, then acks this delivery.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	if err := d.begin(); err != nil {
		return err
	}
	b := d.c.b
	// Declares the dead-letter exchange and queue again if a failed
	// DeadLetter found them missing (forgetUnroutable below).
	if err := b.ensure(ctx, d.c.queue); err != nil {
		return d.requeue(err)
	}
	m := d.msg.Clone()
	now := time.Now()
	sdk.AnnotateDeadLetter(m, d.c.queue, d.attempt, cause, time.Time{}, now)
	out := []outgoing{{id: m.ID, exchange: b.opts.DeadLetterExchange, key: d.c.queue, pub: encode(m, 1, now)}}
	if err := b.sendAll(ctx, out); err != nil {
		b.forgetUnroutable(err, d.c.queue)
		return d.requeue(err)
	}
	return d.ack()
}

// forgetUnroutable makes the next use of name declare it again when err says
// a copy sent to it was returned unroutable: a delay queue, or the
// dead-letter queue of the main queue name, deleted behind the broker's
// back. Without it every later settlement through it failed until the
// connection was replaced.
func (b *Broker) forgetUnroutable(err error, name string) {
	var ue *UnroutableError
	if errors.As(err, &ue) {
		b.forget(name)
	}
}

// requeue gives the delivery back to the queue after a failed copy and
// returns the cause. The copy may have reached the broker all the same
// (a lost confirm): then the message is delivered twice, never lost.
func (d *delivery) requeue(cause error) error {
	if d.st.isDead() {
		return errors.Join(cause, d.lost())
	}
	defer d.st.untrack(d.tag)
	if err := d.st.ch.Nack(d.tag, false, true); err != nil {
		return errors.Join(cause, d.lost())
	}
	return cause
}

// abandon closes the channel the delivery came on, as a crashed consumer
// would: the server requeues every unsettled delivery of that channel.
func (d *delivery) abandon() {
	_ = d.st.ch.Close()
	d.st.kill()
}

var _ sdk.BatchAcker = (*Broker)(nil)

// AckBatch acks ds, deliveries this Broker's Receive returned, at once:
// where the deliveries of one channel are, with those already settled,
// every delivery that channel handed out up to the highest of them, one
// basic.ack with the multiple flag covers them all; otherwise each is acked
// on its own. It returns nil or an error joining, per delivery that was not
// acked, an error naming its message and wrapping the cause (the errors of
// Ack: ErrAlreadySettled, ErrLeaseLost, ErrClosed).
func (b *Broker) AckBatch(ctx context.Context, ds []sdk.Delivery) error {
	var errs []error
	fail := func(d sdk.Delivery, err error) {
		errs = append(errs, fmt.Errorf("rabbitmq: ack of message %s: %w", d.Message().ID, err))
	}
	groups := map[*chanState][]*delivery{}
	var order []*chanState
	for _, sd := range ds {
		d, ok := sd.(*delivery)
		if !ok || d.c.b != b {
			if err := sd.Ack(ctx); err != nil {
				fail(sd, err)
			}
			continue
		}
		if err := d.begin(); err != nil {
			fail(d, err)
			continue
		}
		if _, seen := groups[d.st]; !seen {
			order = append(order, d.st)
		}
		groups[d.st] = append(groups[d.st], d)
	}
	for _, st := range order {
		group := groups[st]
		var hi uint64
		st.mu.Lock()
		for _, d := range group {
			delete(st.unacked, d.tag)
			hi = max(hi, d.tag)
		}
		covered := true // nothing unsettled below hi: multiple is exact
		for t := range st.unacked {
			if t < hi {
				covered = false
				break
			}
		}
		st.mu.Unlock()
		if covered && len(group) > 1 {
			if err := st.ch.Ack(hi, true); err != nil {
				for _, d := range group {
					fail(d, ackErr(d, err))
				}
			}
			continue
		}
		for _, d := range group {
			if err := st.ch.Ack(d.tag, false); err != nil {
				fail(d, ackErr(d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// ackErr classifies a failed basic.ack of d like delivery.ack does.
func ackErr(d *delivery, err error) error {
	if d.st.isDead() || errors.Is(err, amqp.ErrClosed) {
		return d.lost()
	}
	return fmt.Errorf("rabbitmq: ack: %w", err)
}
