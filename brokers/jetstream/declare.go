package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/sdk"
)

// Consumer names: one durable pull consumer per subject, shared by every
// Broker that receives from the queue (work-queue retention allows one
// consumer per subject).
const (
	consumerName      = "berth"
	delayConsumerName = "berth-delay"
)

// delayAckWait is the delay consumer's AckWait: the lease of the mover on
// a delayed message. [Options.Duplicates] is at least twice it.
const delayAckWait = time.Minute

// queueState is what a Broker knows of a declared queue.
type queueState struct {
	name     string // berth queue name
	stream   string // BERTH_Q_<esc>
	dlq      string // BERTH_DLQ_<esc>
	ready    string // berth.q.<esc>
	delayed  string // berth.d.<esc>
	dead     string // berth.dlq.<esc> (a dead letter's subject adds .<id token>)
	moverRun bool   // guarded by Broker.mu
	// ackWaitOK is set once Receive (with NoDeclare) has found the ready
	// consumer's AckWait no shorter than the Broker's.
	ackWaitOK atomic.Bool
}

// escape maps a queue name (letters, digits, '_', '-', '.') onto the
// characters a stream name and a subject token allow, one to one: '_'
// becomes "__" and '.' becomes "_D".
func escape(queue string) string {
	if !strings.ContainsAny(queue, "_.") {
		return queue
	}
	var sb strings.Builder
	for i := 0; i < len(queue); i++ {
		switch c := queue[i]; c {
		case '_':
			sb.WriteString("__")
		case '.':
			sb.WriteString("_D")
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String()
}

// unescape reverses escape; ok is false for a name escape never makes.
func unescape(esc string) (string, bool) {
	if !strings.Contains(esc, "_") {
		return esc, true
	}
	var sb strings.Builder
	for i := 0; i < len(esc); i++ {
		c := esc[i]
		if c != '_' {
			sb.WriteByte(c)
			continue
		}
		if i+1 == len(esc) {
			return "", false
		}
		i++
		switch esc[i] {
		case '_':
			sb.WriteByte('_')
		case 'D':
			sb.WriteByte('.')
		default:
			return "", false
		}
	}
	return sb.String(), true
}

func (b *Broker) names(queue string) *queueState {
	esc := escape(queue)
	up := strings.ToUpper(b.opts.Prefix)
	return &queueState{
		name:    queue,
		stream:  up + "_Q_" + esc,
		dlq:     up + "_DLQ_" + esc,
		ready:   b.opts.Prefix + ".q." + esc,
		delayed: b.opts.Prefix + ".d." + esc,
		dead:    b.opts.Prefix + ".dlq." + esc,
	}
}

// subjects returns the names of queue's stream and subjects: the declared
// queue's when it is declared (no allocation), else computed.
func (b *Broker) subjects(queue string) *queueState {
	if q, ok := b.declared.Load(queue); ok {
		return q.(*queueState)
	}
	return b.names(queue)
}

// StreamNames returns the names of the stream holding queue's messages and
// of the stream holding its dead letters.
func (b *Broker) StreamNames(queue string) (stream, deadLetters string) {
	q := b.names(queue)
	return q.stream, q.dlq
}

// Subject returns the subject of queue's ready messages: what another
// producer publishes to (a message without berth's header is delivered with
// its Nats-Msg-Id as ID and its headers as headers).
func (b *Broker) Subject(queue string) string { return b.names(queue).ready }

// DeclareQueue creates (or updates to this Broker's options) the queue's
// work-queue stream with its ready and delayed subjects, the two durable pull
// consumers on them, and the dead-letter stream. It is idempotent. It never
// shortens the ready consumer's AckWait nor the streams' dedupe windows (see
// [Options.AckWait] and [Options.Duplicates]).
func (b *Broker) DeclareQueue(ctx context.Context, queue string) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return err
	}
	_, err := b.declare(ctx, queue)
	return err
}

// queue returns the state of queue, declaring it on first use.
func (b *Broker) queue(ctx context.Context, queue string) (*queueState, error) {
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	if q, ok := b.declared.Load(queue); ok {
		return q.(*queueState), nil
	}
	if b.opts.NoDeclare {
		q := b.names(queue)
		if _, err := b.js.Stream(ctx, q.stream); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, fmt.Errorf("berth/jetstream: queue %s (stream %s): %w: %w", queue, q.stream, sdk.ErrNotFound, err)
			}
			return nil, b.wrapErr(ctx, "look up stream "+q.stream, err)
		}
		actual, _ := b.declared.LoadOrStore(queue, q)
		return actual.(*queueState), nil
	}
	return b.declare(ctx, queue)
}

func (b *Broker) declare(ctx context.Context, queue string) (*queueState, error) {
	q := b.names(queue)
	o := b.opts
	dups, err := b.longerDuplicates(ctx, q.stream)
	if err != nil {
		return nil, err
	}
	_, err = b.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        q.stream,
		Description: "berth queue " + queue,
		Subjects:    []string{q.ready, q.delayed},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     o.Storage,
		Replicas:    o.Replicas,
		Duplicates:  dups,
		MaxMsgSize:  -1,
		Discard:     jetstream.DiscardOld,
	})
	if err != nil {
		return nil, b.wrapErr(ctx, "declare stream "+q.stream, err)
	}
	for _, c := range []jetstream.ConsumerConfig{
		{Durable: consumerName, FilterSubject: q.ready, AckWait: o.AckWait},
		{Durable: delayConsumerName, FilterSubject: q.delayed, AckWait: delayAckWait},
	} {
		c.AckPolicy = jetstream.AckExplicitPolicy
		c.DeliverPolicy = jetstream.DeliverAllPolicy
		c.MaxDeliver = -1 // berth counts deliveries itself (see the package doc)
		c.MaxAckPending = -1
		c.MaxWaiting = 4096
		c.Description = "berth " + c.Durable + " " + queue
		if c.Durable == consumerName {
			// Never shorten the AckWait: every Broker counts its leases by
			// its own, and one still receiving with a longer one would
			// settle deliveries the server has handed to another consumer.
			cur, err := b.js.Consumer(ctx, q.stream, c.Durable)
			switch {
			case err == nil:
				c.AckWait = max(c.AckWait, cur.CachedInfo().Config.AckWait)
			case !errors.Is(err, jetstream.ErrConsumerNotFound):
				return nil, b.wrapErr(ctx, "look up consumer "+c.Durable+" on "+q.stream, err)
			}
		}
		if _, err := b.js.CreateOrUpdateConsumer(ctx, q.stream, c); err != nil {
			return nil, b.wrapErr(ctx, "declare consumer "+c.Durable+" on "+q.stream, err)
		}
	}
	if dups, err = b.longerDuplicates(ctx, q.dlq); err != nil {
		return nil, err
	}
	_, err = b.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        q.dlq,
		Description: "berth dead letters of queue " + queue,
		Subjects:    []string{q.dead + ".*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     o.Storage,
		Replicas:    o.Replicas,
		Duplicates:  dups,
		MaxMsgSize:  -1,
	})
	if err != nil {
		return nil, b.wrapErr(ctx, "declare stream "+q.dlq, err)
	}
	actual, _ := b.declared.LoadOrStore(queue, q)
	return actual.(*queueState), nil
}

// AckWaitError reports a queue whose ready consumer has a shorter AckWait
// than the Broker's: the server would redeliver jobs the Broker still holds
// by its clock, and their settlements would not report the lost lease. A
// Broker with [Options.NoDeclare] returns it from Receive (DeclareQueue
// lengthens the consumer's AckWait instead). Give the Broker the consumer's
// AckWait, or lengthen the consumer's.
type AckWaitError struct {
	Queue    string
	Consumer time.Duration // the consumer's AckWait
	Broker   time.Duration // [Options.AckWait]
}

// Error names the queue and both AckWaits.
func (e *AckWaitError) Error() string {
	return fmt.Sprintf("berth/jetstream: queue %s: consumer %q has AckWait %s, shorter than the broker's %s: the server would redeliver jobs the broker still holds",
		e.Queue, consumerName, e.Consumer, e.Broker)
}

// checkAckWait returns an [*AckWaitError] when, with NoDeclare, q's ready
// consumer has a shorter AckWait than the Broker's. It reads the consumer
// until it has once found it fine; a consumer not found is left to the pull.
func (b *Broker) checkAckWait(ctx context.Context, q *queueState) error {
	if !b.opts.NoDeclare || q.ackWaitOK.Load() {
		return nil
	}
	c, err := b.js.Consumer(ctx, q.stream, consumerName)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return b.wrapErr(ctx, "look up consumer "+consumerName+" on "+q.stream, err)
	}
	if w := c.CachedInfo().Config.AckWait; w < b.opts.AckWait {
		return &AckWaitError{Queue: q.name, Consumer: w, Broker: b.opts.AckWait}
	}
	q.ackWaitOK.Store(true)
	return nil
}

// longerDuplicates returns the dedupe window to declare stream with: the
// Broker's [Options.Duplicates], or the stream's own when it is longer.
// Never shortened: another Broker of the queue promises its callers that a
// retried Publish within its own window stores nothing twice.
func (b *Broker) longerDuplicates(ctx context.Context, stream string) (time.Duration, error) {
	s, err := b.js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return b.opts.Duplicates, nil
	}
	if err != nil {
		return 0, b.wrapErr(ctx, "look up stream "+stream, err)
	}
	return max(b.opts.Duplicates, s.CachedInfo().Config.Duplicates), nil
}

// DeleteQueue deletes queue's streams (messages, consumers and dead
// letters). Deleting a queue that does not exist succeeds.
func (b *Broker) DeleteQueue(ctx context.Context, queue string) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return err
	}
	q := b.names(queue)
	b.declared.Delete(queue)
	for _, s := range []string{q.stream, q.dlq} {
		if err := b.js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return b.wrapErr(ctx, "delete stream "+s, err)
		}
	}
	return nil
}
