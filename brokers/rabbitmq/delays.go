package rabbitmq

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// DefaultMoveDelaysUpTo is the default [Options.MoveDelaysUpTo].
const DefaultMoveDelaysUpTo = 10 * time.Minute

// moverProbe is how often a mover whose delay queue does not exist yet
// tries again (sooner when this process declares it).
const moverProbe = 30 * time.Second

// mover moves the messages of one delay queue back to its main queue when
// they are due, in place of the server's dead-lettering (see "Delays" in
// the package doc): it consumes the delay queue, holds each delivery for
// the queue's TTL from the moment it arrived, publishes a copy to the main
// queue with a publisher confirm, and acks the delivery once the copy is
// confirmed. A copy that fails is nacked back into the delay queue, to be
// held and tried again. Whatever the mover holds when its channel dies goes
// back to the delay queue, where the server's TTL (or another process's
// mover) takes it.
type mover struct {
	b      *Broker
	queue  string // the main queue
	bucket string // the delay queue
	ttl    time.Duration
	kick   chan struct{} // the delay queue was just declared: try at once
	reset  chan struct{} // a copy sent to the delay queue came back unroutable: consume afresh
	held   atomic.Int64  // deliveries held, for Info
}

// heldMsg is one delivery a mover holds until due.
type heldMsg struct {
	d   amqp.Delivery
	due time.Time
}

// startMovers starts, once per main queue, the movers of its delay queues
// up to Options.MoveDelaysUpTo. Called with b.mu held.
func (b *Broker) startMovers(queue string) {
	if b.opts.MoveDelaysUpTo < b.opts.DelayBuckets[0] {
		return
	}
	if b.mov == nil {
		// The movers' own connection: RabbitMQ 3.10 answers a
		// basic.consume on a quorum queue whose Raft server is not running
		// (being created or deleted) by crashing the channel, which closes
		// the whole connection (541 INTERNAL_ERROR); the consumers'
		// connection must not go with it.
		l := &link{b: b, name: b.opts.ConnectionName + "-move", up: make(chan struct{})}
		b.mov = l
		b.wg.Add(1)
		go func() {
			c, w, err := l.dialRetry(b.ctx)
			if err != nil {
				b.wg.Done()
				return
			}
			l.set(c, w)
			l.supervise(c) // calls wg.Done
		}()
	}
	for _, ttl := range b.opts.DelayBuckets {
		if ttl > b.opts.MoveDelaysUpTo {
			break
		}
		name := DelayQueue(queue, ttl)
		if b.movers[name] != nil {
			continue
		}
		m := &mover{b: b, queue: queue, bucket: name, ttl: ttl, kick: make(chan struct{}, 1), reset: make(chan struct{}, 1)}
		b.movers[name] = m
		b.wg.Add(1)
		go m.run()
	}
}

// kickMover tells the mover of delay queue name, if any, that the queue was
// just declared.
func (b *Broker) kickMover(name string) {
	b.mu.Lock()
	m := b.movers[name]
	b.mu.Unlock()
	if m != nil {
		select {
		case m.kick <- struct{}{}:
		default:
		}
	}
}

// resetMover tells the mover of delay queue name, if any, that the queue
// was found missing: RabbitMQ does not always cancel the consumers of a
// deleted quorum queue, and a consumer left on the deleted queue would
// not see the one declared again under its name.
func (b *Broker) resetMover(name string) {
	b.mu.Lock()
	m := b.movers[name]
	b.mu.Unlock()
	if m != nil {
		select {
		case m.reset <- struct{}{}:
		default:
		}
	}
}

// heldDelayed returns how many deliveries of queue's delay queues this
// process's movers hold.
func (b *Broker) heldDelayed(queue string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n int64
	for _, ttl := range b.opts.DelayBuckets {
		if m := b.movers[DelayQueue(queue, ttl)]; m != nil {
			n += m.held.Load()
		}
	}
	return n
}

// errNoBucket: the delay queue does not exist (yet).
var errNoBucket = errors.New("rabbitmq: delay queue does not exist")

func (m *mover) run() {
	defer m.b.wg.Done()
	log := m.b.opts.Logger.With("broker", "rabbitmq", "queue", m.queue, "delay_queue", m.bucket)
	for attempt := 1; ; {
		err := m.session()
		if m.b.closed() {
			return
		}
		wait := moverProbe
		switch {
		case errors.Is(err, errNoBucket):
			attempt = 1
		case err == nil: // the channel ran and died: reopen after the shortest backoff
			attempt = 1
			wait = m.b.backoff(attempt)
		default:
			log.Warn("rabbitmq delay mover", "attempt", attempt, "err", err)
			attempt++
			wait = m.b.backoff(attempt)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-m.kick:
			t.Stop()
		case <-m.reset:
			t.Stop()
		case <-m.b.closing:
			t.Stop()
			return
		}
	}
}

// session consumes the delay queue on a channel of its own until the
// channel dies or the broker closes. Closing the channel returns what it
// holds to the delay queue.
func (m *mover) session() error {
	b := m.b
	conn, err := b.mov.get(b.ctx)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() {
		_ = ch.Close()
		m.held.Store(0)
	}()
	if err := ch.Qos(m.prefetch(), 0, false); err != nil {
		return err
	}
	dels, err := ch.ConsumeWithContext(b.ctx, m.bucket, "berth-mover-"+sdk.NewID(), false, false, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return errNoBucket
		}
		return err
	}
	var held []heldMsg // in due order (see redeliveredDue), then arrival order
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		var due <-chan time.Time
		if len(held) > 0 {
			timer.Reset(time.Until(held[0].due))
			due = timer.C
		}
		select {
		case d, ok := <-dels:
			if !ok { // the channel died, or the server cancelled the consumer
				return nil
			}
			// Held for the TTL from its arrival here, which is never
			// before it entered the delay queue: never early. A
			// redelivery (a mover's channel died holding it) may be due
			// sooner, and goes in its place in due order.
			h := heldMsg{d: d, due: redeliveredDue(d, time.Now(), m.ttl)}
			i, _ := slices.BinarySearchFunc(held, h.due, func(e heldMsg, due time.Time) int {
				if e.due.After(due) {
					return 1
				}
				return -1 // equal dues keep their arrival order
			})
			held = slices.Insert(held, i, h)
			m.held.Store(int64(len(held)))
		case <-due:
			now := time.Now()
			n := 0
			for n < len(held) && !held[n].due.After(now) {
				n++
			}
			if err := m.move(ch, held[:n]); err != nil {
				return err
			}
			held = held[n:]
			m.held.Store(int64(len(held)))
		case <-m.reset: // what it holds goes back to the queue, if it is still there
			return nil
		case <-b.closing:
			return nil
		}
	}
}

// redeliveredDue is when delivery d of a delay queue of ttl, arriving at
// now, is due. A first delivery is due a ttl after its arrival. A
// redelivery was held by a mover whose channel died: its delay began when
// the copy entered the delay queue, not now, and counting it again from
// now stretched a delay by up to another ttl at every restart. The copy's
// AMQP timestamp (set by berth's Publish and Retry, in whole seconds,
// rounded down) bounds that moment: the copy went in before the stamp's
// next second, so it is due at the latest a second plus ttl after the
// stamp — never early on the sender's clock. The result stays within
// [now, now+ttl]: a missing, far-future or forged stamp changes nothing.
func redeliveredDue(d amqp.Delivery, now time.Time, ttl time.Duration) time.Time {
	due := now.Add(ttl)
	if !d.Redelivered || d.Timestamp.IsZero() {
		return due
	}
	if sent := d.Timestamp.Add(time.Second + ttl); sent.Before(due) {
		due = sent
	}
	if due.Before(now) {
		due = now
	}
	return due
}

// prefetch is how many deliveries a mover holds at most: what it does not
// hold waits in the delay queue, where the server's TTL applies.
func (m *mover) prefetch() int {
	if m.b.opts.Prefetch > 0 {
		return max(m.b.opts.Prefetch, DefaultPrefetch)
	}
	return DefaultPrefetch
}

// move publishes copies of batch to the main queue, then acks the
// deliveries whose copies were confirmed and returns the others to the
// delay queue. An error means the channel is gone (the server has returned
// what was not acked).
func (m *mover) move(ch *amqp.Channel, batch []heldMsg) error {
	if len(batch) == 0 {
		return nil
	}
	b := m.b
	ctx, cancel := context.WithTimeout(b.ctx, b.opts.UnavailableAfter)
	defer cancel()
	out := make([]outgoing, len(batch))
	for i, h := range batch {
		out[i] = outgoing{id: h.d.MessageId, key: m.queue, pub: forwardPublishing(h.d)}
	}
	// By position: the IDs of foreign messages may repeat (see sendEach).
	failed, err := b.sendEach(ctx, out)
	for i, h := range batch {
		var aerr error
		if err != nil || failed != nil && failed[i] != nil {
			aerr = ch.Nack(h.d.DeliveryTag, false, true)
		} else {
			aerr = ch.Ack(h.d.DeliveryTag, false)
		}
		if aerr != nil {
			return aerr
		}
	}
	if failed != nil {
		b.forgetUnroutable(errors.Join(failed...), m.queue)
	}
	return nil
}

// forwardPublishing is the copy of a delay queue's delivery for the main
// queue: the message as it was published, without what the server added
// (x-delivery-count would count the delay queue's redeliveries as
// attempts).
func forwardPublishing(d amqp.Delivery) amqp.Publishing {
	h := make(amqp.Table, len(d.Headers))
	for k, v := range d.Headers {
		if !brokerHeaders[k] {
			h[k] = v
		}
	}
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
