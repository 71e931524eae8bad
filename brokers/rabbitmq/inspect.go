package rabbitmq

import (
	"context"
	"errors"
	"fmt"
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
	tag uint64
	msg *sdk.Message
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
		h.msgs = append(h.msgs, heldMsg{tag: d.DeliveryTag, msg: m})
	}
	return h, nil
}

// ListDeadLetters returns up to limit messages of queue's dead-letter queue,
// oldest first, with their reason headers (messages the server
// dead-lettered through the delivery limit get them from x-death). It reads
// them with basic.get and gives them all back by closing its channel.
func (b *Broker) ListDeadLetters(ctx context.Context, queue string, limit int) ([]*sdk.Message, error) {
	if limit <= 0 {
		limit = sdk.DefaultListLimit
	}
	h, err := b.holdDeadLetters(ctx, queue, limit)
	if err != nil {
		return nil, err
	}
	defer h.ch.Close()
	out := make([]*sdk.Message, len(h.msgs))
	for i, hm := range h.msgs {
		out[i] = hm.msg
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
	defer h.ch.Close()
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
	defer h.ch.Close()
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	var picked []heldMsg
	found := map[string]bool{}
	for _, hm := range h.msgs {
		if len(ids) == 0 || want[hm.msg.ID] {
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
