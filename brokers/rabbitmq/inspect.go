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
//
// Delayed counts the queue's delay queues, one per delay bucket, which are
// declared on first use. AMQP 0-9-1 can only look a queue up by name, and a
// lookup of a missing one costs a channel and an error in the server's log,
// so a delay queue Info found missing is not looked up again for 30 s,
// unless this Broker declares it meanwhile: a delay queue another process
// declares is counted within 30 s.
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
		if errors.Is(err, sdk.ErrNotFound) {
			b.forgetAbsent(queue) // a deleted queue's entries would stay forever
		}
		return info, fmt.Errorf("rabbitmq: inspect %q: %w", queue, err)
	}
	info.Ready, info.Consumers = int64(q.Messages), q.Consumers
	if q, err := b.inspect(ctx, DeadLetterQueue(queue)); err == nil {
		info.DeadLettered = int64(q.Messages)
	} else if !errors.Is(err, sdk.ErrNotFound) {
		return info, fmt.Errorf("rabbitmq: inspect %q: %w", DeadLetterQueue(queue), err)
	}
	for _, ttl := range b.opts.DelayBuckets {
		name := DelayQueue(queue, ttl)
		if b.knownAbsent(name) {
			continue
		}
		q, err := b.inspect(ctx, name)
		if errors.Is(err, sdk.ErrNotFound) {
			b.setAbsent(name, true)
			continue
		}
		if err != nil {
			return info, fmt.Errorf("rabbitmq: inspect %q: %w", name, err)
		}
		b.setAbsent(name, false)
		info.Delayed += int64(q.Messages)
	}
	info.Delayed += b.heldDelayed(queue)
	return info, nil
}

// absentRecheck is how long Info trusts that a delay queue it found missing
// is still missing.
const absentRecheck = 30 * time.Second

// knownAbsent reports whether Info found delay queue name missing less than
// absentRecheck ago and this Broker has not declared it since.
func (b *Broker) knownAbsent(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	at, ok := b.absent[name]
	return ok && !b.declared[name] && time.Since(at) < b.absentRecheck
}

// forgetAbsent drops what Info recorded of queue's delay queues.
func (b *Broker) forgetAbsent(queue string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, ttl := range b.opts.DelayBuckets {
		delete(b.absent, DelayQueue(queue, ttl))
	}
}

// setAbsent records whether Info found delay queue name missing.
func (b *Broker) setAbsent(name string, missing bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if missing {
		b.absent[name] = time.Now()
	} else {
		delete(b.absent, name)
	}
}

func (b *Broker) inspect(ctx context.Context, name string) (amqp.Queue, error) {
	if b.inspectHook != nil {
		b.inspectHook(name)
	}
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
