package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// QueueInfo is what AMQP 0-9-1 tells about a queue without the management
// plugin: ready messages and consumers, per queue.
type QueueInfo struct {
	Queue        string
	Ready        int64 // ready in the main queue
	Consumers    int   // consumers of the main queue, in every process
	Delayed      int64 // in the queue's delay queues (Message.Delay and Retry)
	DeadLettered int64 // in "<queue>.dlq"
}

// Info reports queue's depth, its consumers, its delayed and dead-lettered
// messages. It fails with an error wrapping [sdk.ErrNotFound] when the
// queue does not exist.
func (b *Broker) Info(ctx context.Context, queue string) (QueueInfo, error) {
	if b.closed() {
		return QueueInfo{}, sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return QueueInfo{}, err
	}
	info := QueueInfo{Queue: queue}
	q, err := b.inspect(ctx, queue)
	if err != nil {
		return info, fmt.Errorf("rabbitmq: inspect %q: %w", queue, err)
	}
	info.Ready, info.Consumers = int64(q.Messages), q.Consumers
	if q, err := b.inspect(ctx, DeadLetterQueue(queue)); err == nil {
		info.DeadLettered = int64(q.Messages)
	} else if !errors.Is(err, sdk.ErrNotFound) {
		return info, fmt.Errorf("rabbitmq: inspect %q: %w", DeadLetterQueue(queue), err)
	}
	for _, ttl := range b.opts.DelayBuckets {
		q, err := b.inspect(ctx, DelayQueue(queue, ttl))
		if errors.Is(err, sdk.ErrNotFound) {
			continue
		}
		if err != nil {
			return info, fmt.Errorf("rabbitmq: inspect %q: %w", DelayQueue(queue, ttl), err)
		}
		info.Delayed += int64(q.Messages)
	}
	return info, nil
}

func (b *Broker) inspect(ctx context.Context, name string) (amqp.Queue, error) {
	var q amqp.Queue
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		var err error
		q, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
		return err
	})
	return q, err
}

// Stats implements [sdk.Inspector] with what AMQP reports: Ready, Delayed
// and DeadLettered are the server's counts; InFlight and OldestAge are
// always 0, because only the management API knows unacknowledged counts
// and message ages.
func (b *Broker) Stats(ctx context.Context, queue string) (sdk.QueueStats, error) {
	info, err := b.Info(ctx, queue)
	if err != nil {
		return sdk.QueueStats{Queue: queue}, err
	}
	return sdk.QueueStats{Queue: queue, Ready: info.Ready, Delayed: info.Delayed, DeadLettered: info.DeadLettered}, nil
}

// heldDLQ is a dead-letter queue read with basic.get on a channel of its
// own: the messages it holds are unacknowledged, invisible to other readers
// and not delivered twice, until they are acked (removed) or the channel
// closes (every one goes back, in order). Nothing is lost if the process
// dies half way.
type heldDLQ struct {
	ch   *amqp.Channel
	msgs []heldMsg
}

type heldMsg struct {
	tag  uint64
	msg  *sdk.Message
	raw  amqp.Publishing // the dead letter as the server holds it, for giveBack
	done bool            // acked (redriven): not given back
}

// giveBack returns the held dead letters that were not redriven to the
// dead-letter queue without wearing them out, then closes the channel.
// Returning them by closing the channel (or nack) raises a quorum queue's
// x-delivery-count on every listing (RabbitMQ 3.x and 4.0–4.2; measured
// here: 25 listings, x-delivery-count 25), and a delivery limit on the
// dead-letter queue (RabbitMQ 4's default is 20) would then drop them. So
// each is republished as it is, headers and x-death included, in order, to
// the dead-letter queue, and acked once confirmed: its copy starts with no
// delivery count. Messages dead-lettered while a listing runs may end up
// before the ones it gives back; a copy that fails is returned by closing
// the channel, with a delivery counted. A crash between a confirm and its
// ack leaves a dead letter twice, never none.
func (b *Broker) giveBack(ctx context.Context, queue string, h *heldDLQ) {
	defer h.ch.Close()
	var out []outgoing
	var back []heldMsg
	for _, hm := range h.msgs {
		if !hm.done {
			out = append(out, outgoing{id: hm.msg.ID, key: DeadLetterQueue(queue), pub: hm.raw})
			back = append(back, hm)
		}
	}
	if len(out) == 0 || h.ch.IsClosed() {
		return // a closed channel: the server has returned them already
	}
	// Not the caller's ctx alone: a listing that is cancelled still gives
	// its dead letters back properly when it can.
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.CloseTimeout)
	defer cancel()
	err := b.sendAll(gctx, out)
	var pe *sdk.PublishError
	if err != nil && !errors.As(err, &pe) {
		return
	}
	for _, hm := range back {
		if pe != nil && pe.Failed[hm.msg.ID] != nil {
			continue
		}
		_ = h.ch.Ack(hm.tag, false)
	}
	// See consumer.handBack: let the server apply the acks before the
	// channel closes.
	t := time.NewTimer(settleGrace)
	defer t.Stop()
	select {
	case <-t.C:
	case <-gctx.Done():
	}
}

// holdDeadLetters gets up to limit messages (all when limit <= 0) of
// queue's dead-letter queue. The caller must close h.ch.
func (b *Broker) holdDeadLetters(ctx context.Context, queue string, limit int) (*heldDLQ, error) {
	if b.closed() {
		return nil, sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	conn, err := b.pub.get(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("%w: rabbitmq: open channel: %w", sdk.ErrUnavailable, err)
	}
	h := &heldDLQ{ch: ch}
	for limit <= 0 || len(h.msgs) < limit {
		if err := ctx.Err(); err != nil {
			_ = ch.Close()
			return nil, err
		}
		d, ok, err := ch.Get(DeadLetterQueue(queue), false)
		if err != nil {
			_ = ch.Close()
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.NotFound {
				return nil, fmt.Errorf("%w: rabbitmq: dead-letter queue %q: %w", sdk.ErrNotFound, DeadLetterQueue(queue), err)
			}
			return nil, fmt.Errorf("%w: rabbitmq: read dead-letter queue %q: %w", sdk.ErrUnavailable, DeadLetterQueue(queue), err)
		}
		if !ok {
			break
		}
		m := decode(d.Headers, d.MessageId, d.Type, d.CorrelationId, d.Body).msg
		annotateBrokerDeath(m, d.Headers, queue)
		raw := amqp.Publishing{
			Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
			DeliveryMode: amqp.Persistent, Priority: d.Priority, CorrelationId: d.CorrelationId,
			ReplyTo: d.ReplyTo, Expiration: d.Expiration, MessageId: d.MessageId, Timestamp: d.Timestamp,
			Type: d.Type, AppId: d.AppId, Body: d.Body, // not UserId: the server checks it against the login
		}
		if raw.Headers != nil {
			raw.Headers = maps.Clone(raw.Headers)
			delete(raw.Headers, "x-delivery-count")
		}
		h.msgs = append(h.msgs, heldMsg{tag: d.DeliveryTag, msg: m, raw: raw})
	}
	return h, nil
}

// ListDeadLetters returns up to limit messages of queue's dead-letter queue,
// oldest first, with their reason headers (messages the server
// dead-lettered through the delivery limit get them from x-death). It reads
// the whole dead-letter queue with basic.get and gives it back in order
// without raising delivery counts (see the package doc).
func (b *Broker) ListDeadLetters(ctx context.Context, queue string, limit int) ([]*sdk.Message, error) {
	if limit <= 0 {
		limit = sdk.DefaultListLimit
	}
	// The whole queue: giving back only the first limit would move them
	// behind the rest.
	h, err := b.holdDeadLetters(ctx, queue, 0)
	if err != nil {
		return nil, err
	}
	defer b.giveBack(ctx, queue, h)
	out := make([]*sdk.Message, 0, min(limit, len(h.msgs)))
	for _, hm := range h.msgs[:min(limit, len(h.msgs))] {
		out = append(out, hm.msg)
	}
	return out, nil
}

// GetDeadLetter returns the dead letter with message ID id, or an error
// wrapping [sdk.ErrNotFound]. It reads the whole dead-letter queue.
func (b *Broker) GetDeadLetter(ctx context.Context, queue, id string) (*sdk.Message, error) {
	h, err := b.holdDeadLetters(ctx, queue, 0)
	if err != nil {
		return nil, err
	}
	defer b.giveBack(ctx, queue, h)
	for _, hm := range h.msgs {
		if hm.msg.ID == id {
			return hm.msg, nil
		}
	}
	return nil, fmt.Errorf("%w: dead letter %s in %q", sdk.ErrNotFound, id, DeadLetterQueue(queue))
}

// RedriveDeadLetters publishes the dead letters with the given IDs (all
// when none) back to queue, the queue whose dead-letter queue holds them
// (whatever their berth-dlq-queue header says) with attempts reset and the
// redrive counted ([sdk.PrepareRedrive]), waits for the confirms, and only
// then removes them from the dead-letter queue. Unknown IDs give an error
// wrapping [sdk.ErrNotFound] and redrive nothing. It returns how many were
// redriven.
func (b *Broker) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	h, err := b.holdDeadLetters(ctx, queue, 0)
	if err != nil {
		return 0, err
	}
	defer b.giveBack(ctx, queue, h)
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	var picked []*heldMsg
	found := map[string]bool{}
	for i := range h.msgs {
		if hm := &h.msgs[i]; len(ids) == 0 || want[hm.msg.ID] {
			picked = append(picked, hm)
			found[hm.msg.ID] = true
		}
	}
	for _, id := range ids {
		if !found[id] {
			return 0, fmt.Errorf("%w: dead letter %s in %q", sdk.ErrNotFound, id, DeadLetterQueue(queue))
		}
	}
	now := time.Now()
	out := make([]outgoing, 0, len(picked))
	if err := b.ensure(ctx, queue); err != nil {
		return 0, err
	}
	for _, hm := range picked {
		// The target is the queue whose dead-letter queue this is, never
		// the berth-dlq-queue header: a message can carry a forged one.
		sdk.PrepareRedrive(hm.msg, queue)
		out = append(out, outgoing{id: hm.msg.ID, key: queue, pub: encode(hm.msg, 1, now)})
	}
	// One pipelined batch; a dead letter is removed only once its copy is
	// confirmed on its queue.
	sendErr := b.sendAll(ctx, out)
	var pe *sdk.PublishError
	if sendErr != nil && !errors.As(sendErr, &pe) {
		return 0, sendErr
	}
	redriven := 0
	for _, hm := range picked {
		if pe != nil && pe.Failed[hm.msg.ID] != nil {
			continue
		}
		hm.done = true // redriven: not given back, whether or not the ack below lands
		if err := h.ch.Ack(hm.tag, false); err != nil {
			// The copy is on its queue; the dead letter stays too.
			return redriven, errors.Join(sendErr, fmt.Errorf("%w: rabbitmq: remove redriven dead letter %s: %w", sdk.ErrUnavailable, hm.msg.ID, err))
		}
		redriven++
	}
	return redriven, sendErr
}

// PurgeDeadLetters deletes every ready message of queue's dead-letter queue
// and returns how many.
func (b *Broker) PurgeDeadLetters(ctx context.Context, queue string) (int, error) {
	if b.closed() {
		return 0, sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return 0, err
	}
	var n int
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		var err error
		n, err = ch.QueuePurge(DeadLetterQueue(queue), false)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("rabbitmq: purge %q: %w", DeadLetterQueue(queue), err)
	}
	return n, nil
}
