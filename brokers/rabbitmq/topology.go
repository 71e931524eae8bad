package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// DeadLetterQueue returns the name of queue's dead-letter queue.
func DeadLetterQueue(queue string) string { return queue + ".dlq" }

// DelayQueue returns the name of the delay queue that holds messages for
// queue for ttl before dead-lettering them back to it.
func DelayQueue(queue string, ttl time.Duration) string {
	return queue + ".delay." + formatTTL(ttl)
}

func formatTTL(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	default:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	}
}

// bucket returns the TTL of the delay queue for d: the smallest bucket not
// below d, or the largest bucket.
func (b *Broker) bucket(d time.Duration) time.Duration {
	for _, ttl := range b.opts.DelayBuckets {
		if ttl >= d {
			return ttl
		}
	}
	return b.opts.DelayBuckets[len(b.opts.DelayBuckets)-1]
}

// mainArgs are the arguments of a main queue.
func (b *Broker) mainArgs(queue string) amqp.Table {
	args := amqp.Table{
		"x-queue-type":              string(b.opts.QueueType),
		"x-dead-letter-exchange":    b.opts.DeadLetterExchange,
		"x-dead-letter-routing-key": queue,
	}
	if b.opts.QueueType == Quorum {
		args["x-delivery-limit"] = int64(b.opts.MaxDeliveries - 1)
		args["x-dead-letter-strategy"] = "at-least-once"
		args["x-overflow"] = "reject-publish"
	}
	return args
}

// delayArgs are the arguments of a delay queue: a TTL, dead-lettering back
// to the main queue through the default exchange.
func (b *Broker) delayArgs(queue string, ttl time.Duration) amqp.Table {
	args := amqp.Table{
		"x-queue-type":              string(b.opts.QueueType),
		"x-message-ttl":             ttl.Milliseconds(),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": queue,
	}
	if b.opts.QueueType == Quorum {
		args["x-dead-letter-strategy"] = "at-least-once"
		args["x-overflow"] = "reject-publish"
	}
	return args
}

// DeclareQueue declares queue, the dead-letter exchange, "<queue>.dlq" bound
// to it, with the broker's queue type and delivery limit. It is idempotent;
// declaring an existing queue with other arguments fails (RabbitMQ's
// PRECONDITION_FAILED). Delay queues are declared when first used.
func (b *Broker) DeclareQueue(ctx context.Context, queue string) error {
	if b.closed() {
		return sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return err
	}
	return b.declareShared(ctx, queue, true, b.declareTopology)
}

// declareTopology declares queue, its dead-letter exchange and queue.
func (b *Broker) declareTopology(ctx context.Context, queue string) error {
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(b.opts.DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
			return err
		}
		dlqArgs := amqp.Table{"x-queue-type": string(b.opts.QueueType)}
		if _, err := ch.QueueDeclare(DeadLetterQueue(queue), true, false, false, false, dlqArgs); err != nil {
			return err
		}
		if err := ch.QueueBind(DeadLetterQueue(queue), queue, b.opts.DeadLetterExchange, false, nil); err != nil {
			return err
		}
		_, err := ch.QueueDeclare(queue, true, false, false, false, b.mainArgs(queue))
		return err
	})
	if err != nil {
		return fmt.Errorf("rabbitmq: declare queue %q: %w", queue, err)
	}
	return nil
}

// declareCall is a declaration in flight, which concurrent callers for the
// same name wait for instead of declaring too.
type declareCall struct {
	done chan struct{}
	err  error // set before done is closed
}

// declareShared runs declare(ctx, name) unless the current connection has
// declared name already (always, when force), and records success.
// Concurrent callers for the same name wait for the declaration in flight
// and share its outcome rather than declaring again.
//
// Waiting is what keeps messages from being lost: RabbitMQ creates a
// quorum queue in two steps, its record (from then on a declaration of the
// same name answers declare-ok and publishes are routed to it) and then its
// Raft cluster, and when the second step fails (cluster_not_formed, or a
// timeout, while a node is down or starting) it deletes the queue again,
// with whatever was published to it in between, confirms and all
// (RELIABILITY.md). A second declarer that went ahead would publish a
// retry's copy into that doomed queue and ack the original.
func (b *Broker) declareShared(ctx context.Context, name string, force bool, declare func(context.Context, string) error) error {
	for {
		b.mu.Lock()
		if !force && b.declared[name] {
			b.mu.Unlock()
			return nil
		}
		if c := b.declaring[name]; c != nil {
			b.mu.Unlock()
			select {
			case <-c.done:
			case <-ctx.Done():
				return fmt.Errorf("%w: rabbitmq: declare %q: %w", sdk.ErrUnavailable, name, ctx.Err())
			}
			if c.err != nil {
				return c.err
			}
			if force {
				return nil
			}
			continue
		}
		c := &declareCall{done: make(chan struct{})}
		b.declaring[name] = c
		b.mu.Unlock()
		err := declare(ctx, name)
		b.mu.Lock()
		delete(b.declaring, name)
		if err == nil {
			b.declared[name] = true
			delete(b.absent, name) // Info looks it up again, even once declared is forgotten
		}
		c.err = err
		b.mu.Unlock()
		close(c.done)
		return err
	}
}

// withChannel runs fn on a fresh channel of the publishing connection and
// closes it. A channel error (404, 406) closes only that channel; a 404
// wraps [sdk.ErrNotFound]. A failure of the connection itself (lost
// mid-call: amqp091's 501 "EOF"; closed by the server: 320
// CONNECTION_FORCED; any other hard AMQP error, which closes the
// connection) wraps [sdk.ErrUnavailable], the original error kept in the
// chain: the supervisor reconnects, and the caller may try again.
func (b *Broker) withChannel(ctx context.Context, fn func(ch *amqp.Channel) error) error {
	conn, err := b.pub.get(ctx)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("%w: rabbitmq: open channel: %w", sdk.ErrUnavailable, err)
	}
	defer ch.Close()
	err = fn(ch)
	if err == nil {
		return nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return fmt.Errorf("%w: %w", sdk.ErrNotFound, err)
	}
	if connectionLost(conn, err) {
		return fmt.Errorf("%w: rabbitmq: connection lost: %w", sdk.ErrUnavailable, err)
	}
	return err
}

// connectionLost reports whether err, returned by a call on a channel of
// conn, is the failure of the connection rather than of the call: the
// channel or connection was already closed (amqp.ErrClosed), the error is a
// hard (connection-level) AMQP error, which the server or amqp091 raises
// only when closing the connection, or conn is closed by now. A soft
// error (404, 406, 403...) closes only the channel and is the call's own.
func connectionLost(conn *amqp.Connection, err error) bool {
	if errors.Is(err, amqp.ErrClosed) {
		return true
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && !ae.Recover {
		return true
	}
	return conn.IsClosed()
}

// ensure declares queue's topology once per connection, unless NoDeclare.
func (b *Broker) ensure(ctx context.Context, queue string) error {
	if b.opts.NoDeclare {
		return nil
	}
	return b.declareShared(ctx, queue, false, b.declareTopology)
}

// ensureDelay declares the delay queue for queue and d, once per
// connection, and returns its name. With NoDeclare the name only.
func (b *Broker) ensureDelay(ctx context.Context, queue string, d time.Duration) (string, error) {
	ttl := b.bucket(d)
	name := DelayQueue(queue, ttl)
	if b.opts.NoDeclare {
		return name, nil
	}
	err := b.declareShared(ctx, name, false, func(ctx context.Context, name string) error {
		err := b.withChannel(ctx, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(name, true, false, false, false, b.delayArgs(queue, ttl))
			return err
		})
		if err != nil {
			return fmt.Errorf("rabbitmq: declare delay queue %q: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	b.kickMover(name)
	return name, nil
}

// forget makes the next use of name declare it again.
func (b *Broker) forget(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.declared, name)
}

// forgetDeclared makes the next use of every queue declare it again, after
// a reconnection (the server may have restarted and lost non-durable state).
func (b *Broker) forgetDeclared() {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.declared)
}

// DeleteQueue deletes queue, its dead-letter queue and its delay queues,
// whatever they hold. For tests and tooling.
func (b *Broker) DeleteQueue(ctx context.Context, queue string) error {
	if b.closed() {
		return sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return err
	}
	names := []string{queue, DeadLetterQueue(queue)}
	for _, ttl := range b.opts.DelayBuckets {
		names = append(names, DelayQueue(queue, ttl))
	}
	for _, n := range names {
		err := b.withChannel(ctx, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(n, false, false, false)
			return err
		})
		if err != nil && !errors.Is(err, sdk.ErrNotFound) {
			return fmt.Errorf("rabbitmq: delete queue %q: %w", n, err)
		}
		b.mu.Lock()
		delete(b.declared, n)
		b.mu.Unlock()
	}
	return nil
}
