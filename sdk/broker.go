package sdk

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"
)

// Delivery is one receipt of a [Message]; the same Message can be delivered
// many times. Brokers implement it; the [Worker] settles each Delivery exactly
// once with one of Ack, Retry, DeadLetter (or [Releaser.Release]).
//
// A Delivery is used by one goroutine at a time, except ExtendLease, which the
// Worker's heartbeat may call while the handler runs (and, on an
// [AsyncAcker], while its ack is in flight). A second settlement
// returns [ErrAlreadySettled]; a settlement after the lease was lost returns an
// error wrapping [ErrLeaseLost] and changes nothing. Settlement errors are safe
// to ignore for correctness: an unsettled delivery comes back.
type Delivery interface {
	// Message returns the delivered message. Callers must not modify it.
	Message() *Message
	// Attempt is 1 on the first delivery and counts retries and crash
	// redeliveries (expired leases) alike.
	Attempt() int
	// Queue is the queue the delivery came from.
	Queue() string
	// Ack removes the message: its work is done.
	Ack(ctx context.Context) error
	// Retry returns the message to be delivered again, not before delay, with
	// Attempt()+1. cause is recorded where the broker can keep it.
	Retry(ctx context.Context, delay time.Duration, cause error) error
	// DeadLetter moves the message to the queue's dead-letter queue with the
	// reason headers (see [AnnotateDeadLetter]).
	DeadLetter(ctx context.Context, cause error) error
	// ExtendLease pushes the lease (visibility timeout) to d from now. Brokers
	// without leases return nil and document how they detect dead consumers.
	ExtendLease(ctx context.Context, d time.Duration) error
}

// Publisher sends messages to a queue.
//
// Publish may be called concurrently. It calls [Prepare] on every message
// first (filling IDs, checking sizes and names), so msgs are modified; it does
// not retain them after it returns. It returns once the broker has durably
// accepted every message (publisher confirms, a committed row, a 200 from
// SQS), or an error: a batch that fails validation publishes nothing; a batch
// that fails at the broker may be partially published, and the error says
// which ([PublishError]). Retrying a failed Publish is safe: consumers dedupe
// by IdempotencyKey, not by delivery. After Close it returns [ErrClosed].
// With ctx already done it publishes nothing and returns ctx.Err() (every
// broker, the in-memory one included).
type Publisher interface {
	Publish(ctx context.Context, queue string, msgs ...*Message) error
}

// Subscriber hands out deliveries.
//
// Receive returns between 1 and max deliveries leased to the caller, waiting
// (without busy looping) while the queue is empty. It may return an empty
// slice with a nil error after a broker-specific long-poll window; callers
// loop. It returns ctx.Err() when ctx is done, and [ErrClosed] after Close.
// Receive may be called concurrently; two receivers never hold the same
// message at the same time while its lease lasts.
type Subscriber interface {
	Receive(ctx context.Context, queue string, max int) ([]Delivery, error)
}

// Broker is a Publisher and a Subscriber that can be closed.
//
// Close releases the broker's connections and goroutines. It is safe to call
// more than once (later calls return nil); every other call after it returns
// [ErrClosed]. Deliveries received before
// Close and not settled come back after their lease.
type Broker interface {
	Publisher
	Subscriber
	Close() error
}

// Releaser is implemented by deliveries that can be handed back without
// consuming an attempt: the next delivery has the same Attempt(). The Worker
// uses it for work interrupted by shutdown and for [RetryAfter]; when a
// delivery lacks it, the Worker falls back to Retry.
type Releaser interface {
	Release(ctx context.Context, delay time.Duration) error
}

// LongPoller is implemented by subscribers whose Receive long-polls a
// server that counts an attempt for every message it hands out, even to a
// call whose caller has gone by the time the answer arrives (SQS counts
// each in ApproximateReceiveCount). ReceiveWait is the longest a Receive
// waits on an empty queue.
//
// A [Worker] shutting down does not cancel such a Receive in flight at
// once: it gives it [LongPollGrace] (or ReceiveWait plus a second, if that
// is shorter; never beyond DrainTimeout) to return, and runs what it
// returns. Cancelled at once, a long poll the server had just answered
// would hand those messages back one attempt later: the drain would
// consume their attempt. A poll of an idle queue has nothing to lose and
// is cut off after the grace, so an idle Worker still stops within it.
type LongPoller interface {
	ReceiveWait() time.Duration
}

// ReceiveBatcher is implemented by subscribers whose Receive returns at
// most ReceiveBatch deliveries a call, whatever max it is given (SQS: 10 per
// ReceiveMessage). A [Worker] with several [WorkerOptions.ReceiveLoops]
// then gives each Receive at most that many slots, so that its loops' calls
// are in flight together instead of one loop holding every free slot
// through its call; and a loop starts a Receive of fewer only when no other
// loop's Receive is in flight and no received work waits for a handler, so
// that calls carry full batches (each is a billed request on SQS).
type ReceiveBatcher interface {
	ReceiveBatch() int
}

type receiveCapacityKey struct{}

// WithReceiveCapacity returns a copy of ctx telling the Receive calls made
// under it that their caller holds up to n deliveries of a queue at once,
// whatever max each call asks for. A [Worker] receives under its capacity
// (Concurrency + Prefetch): with several [WorkerOptions.Queues] a Receive
// asks only for the slots its queue was handed (an idle queue's, for one),
// so max says little about how many the Worker will hold. Brokers that take
// a queue's messages in ahead of Receive size that by it (RabbitMQ: the
// consumer's prefetch); the others ignore it. Being a value of ctx, it
// reaches the broker through any wrapper that passes ctx on.
func WithReceiveCapacity(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, receiveCapacityKey{}, n)
}

// ReceiveCapacity returns the capacity [WithReceiveCapacity] put on ctx, or
// 0 when none (or not above 0) was.
func ReceiveCapacity(ctx context.Context) int {
	if n, ok := ctx.Value(receiveCapacityKey{}).(int); ok && n > 0 {
		return n
	}
	return 0
}

// LongPollGrace is how long a draining [Worker] lets a [LongPoller]'s
// Receive in flight go on: an answer the server has already sent arrives
// well within it.
const LongPollGrace = 2 * time.Second

// AsyncAcker is implemented by deliveries whose Ack can finish in the
// background, written together with the acks of other finished jobs
// (PostgreSQL: one UPDATE, one commit, for many). AckAsync does what Ack
// does, without waiting: done is called exactly once, from any goroutine, by
// the time ctx is done at the latest, with what Ack would have returned (nil,
// an error wrapping [ErrLeaseLost] when the lease was lost, ...). done must
// not block.
//
// The Worker uses it for successful jobs so that a handler goroutine moves on
// to the next job while the ack is committed: the delivery keeps its slot,
// and its heartbeat keeps extending its lease, until done, so that an ack
// slow to be written (a lock, a slow disk) does not let the lease lapse and
// another consumer run the job again; observers see the settlement, with its
// error, then. ExtendLease must therefore work while an ack is in flight,
// and report [ErrAlreadySettled] once it is written (or [ErrLeaseLost] when
// the lease is lost). An ack is only ever delayed, never made for unfinished
// work; a crash before it is written means a redelivery, as a crash before a
// synchronous Ack does.
type AsyncAcker interface {
	AckAsync(ctx context.Context, done func(error))
}

// BatchAcker is implemented by brokers that ack many deliveries in one
// operation (RabbitMQ: one basic.ack with the multiple flag). Use
// [AckAll], which falls back to one Ack per delivery.
type BatchAcker interface {
	// AckBatch acks ds, deliveries of this broker (others are acked one by
	// one). It returns nil or an error joining one error per delivery not
	// acked, each naming its message and wrapping the cause.
	AckBatch(ctx context.Context, ds []Delivery) error
}

// AckAll acks every delivery of ds, for callers of Receive that settle a
// batch at once: through sub's [BatchAcker] when it has one, else one Ack
// per delivery. It returns nil or an error joining one error per delivery
// not acked (errors.Is finds [ErrAlreadySettled], [ErrLeaseLost], ...).
func AckAll(ctx context.Context, sub Subscriber, ds []Delivery) error {
	if ba, ok := sub.(BatchAcker); ok {
		return ba.AckBatch(ctx, ds)
	}
	var errs []error
	for _, d := range ds {
		if err := d.Ack(ctx); err != nil {
			errs = append(errs, fmt.Errorf("berth: ack of message %s: %w", d.Message().ID, err))
		}
	}
	return errors.Join(errs...)
}

// ReceiveStopper is implemented by subscribers that take a queue's messages
// in ahead of Receive (RabbitMQ: the deliveries its consumer's prefetch
// brings to this process, unacked), where no other consumer can have them.
// StopReceiving stops taking queue's messages in and hands back those
// taken in that no Receive has returned, without consuming an attempt;
// deliveries Receive returned are not touched. The next Receive of queue, or
// one waiting on it, takes messages in again. It returns once they are
// handed back (nil when nothing was held), or with ctx.Err() once ctx is
// done (the hand-back may go on). [Worker.Pause] calls it in the
// background, so that a paused queue's messages go to the consumers still
// receiving; Resume cancels that call's ctx, and Run cancels it and waits
// for it before returning.
type ReceiveStopper interface {
	StopReceiving(ctx context.Context, queue string) error
}

// Flusher is implemented by brokers that buffer settlements (for example SQS
// batches deletes). The Worker calls Flush when it drains.
type Flusher interface {
	Flush(ctx context.Context) error
}

// QueueDeclarer creates a queue and its companions (dead-letter queue, retry
// queues, redrive policy). It is idempotent: declaring an existing queue with
// the same settings succeeds.
type QueueDeclarer interface {
	DeclareQueue(ctx context.Context, queue string) error
}

// QueueStats is a snapshot of a queue. Brokers whose counters are approximate
// (SQS) say so in their docs.
type QueueStats struct {
	Queue        string
	Ready        int64         // deliverable now
	Delayed      int64         // scheduled for later (publish delay or Retry)
	InFlight     int64         // leased to a consumer, not settled
	DeadLettered int64         // in the dead-letter queue
	OldestAge    time.Duration // age of the oldest ready message, 0 when none
}

// Inspector reports queue statistics.
type Inspector interface {
	Stats(ctx context.Context, queue string) (QueueStats, error)
}

// DeadLetters lists, shows, redrives and purges a queue's dead letters. The
// messages it returns carry the reason headers ([HeaderDeadLetterReason] and
// the others). Redrive puts messages back on their original queue with
// attempts reset and [HeaderRedriveCount] incremented; with no ids it redrives
// them all. Unknown ids give [ErrNotFound]. ListDeadLetters returns at most
// limit messages, oldest first where the broker knows the order; a limit <= 0
// means [DefaultListLimit].
type DeadLetters interface {
	ListDeadLetters(ctx context.Context, queue string, limit int) ([]*Message, error)
	GetDeadLetter(ctx context.Context, queue, id string) (*Message, error)
	RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error)
	PurgeDeadLetters(ctx context.Context, queue string) (int, error)
}

// DefaultListLimit is the number of dead letters ListDeadLetters returns when
// given a limit <= 0.
const DefaultListLimit = 100

// AnnotateDeadLetter sets the dead-letter headers on m (a copy the broker is
// about to store): reason, class, attempts, original queue and failure times.
// firstFailure may be zero, in which case the [HeaderFirstFailure] already on
// m is kept (a broker's own record, e.g. on RabbitMQ's retry copies) or, if
// none, now is used. A header already on m may also come from a producer
// outside berth, so it is not trusted as it is: it is kept only when it is an
// RFC 3339 time not after now (rewritten in UTC); a value that does not
// parse, or a first failure after the last, is replaced with now. Every
// broker uses it so dead letters look alike.
//
// The reason is the cause's text made valid UTF-8 and cut to
// [MaxReasonLength] bytes: an error may carry any bytes, and a dead letter
// must fit every broker (PostgreSQL refuses invalid UTF-8, SQS limits size).
func AnnotateDeadLetter(m *Message, queue string, attempt int, cause error, firstFailure, now time.Time) {
	reason, class := "dead-lettered", ClassUnknown
	if cause != nil {
		reason, class = cause.Error(), Classify(cause)
	}
	delete(m.Headers, HeaderDeadLetterTruncated) // only FitDeadLetter writes it, after this
	m.SetHeader(HeaderDeadLetterReason, SanitizeReason(reason))
	m.SetHeader(HeaderDeadLetterClass, string(class))
	m.SetHeader(HeaderDeadLetterAttempts, strconv.Itoa(attempt))
	m.SetHeader(HeaderDeadLetterQueue, queue)
	SetFirstFailure(m, firstFailure, now)
	m.SetHeader(HeaderLastFailure, now.UTC().Format(time.RFC3339Nano))
}

// SetFirstFailure sets [HeaderFirstFailure] on m, a copy a broker stores
// after a failure at now, by the rule of [AnnotateDeadLetter]: firstFailure
// when it is not zero; else the header already on m when it is an RFC 3339
// time not after now (a broker's own record, e.g. on RabbitMQ's retry
// copies; it may also come from a producer outside berth, so it is not
// trusted as it is), rewritten in UTC; else now. Times are written as
// [time.RFC3339Nano] writes them. Brokers that carry the first failure on
// the message from one attempt to the next (RabbitMQ's Retry) use it, so
// that a forged or garbage header is not passed on as berth's.
func SetFirstFailure(m *Message, firstFailure, now time.Time) {
	first := now
	if !firstFailure.IsZero() {
		first = firstFailure
	} else if t, ok := parseFirstFailure(m.Header(HeaderFirstFailure), now); ok {
		first = t
	}
	m.SetHeader(HeaderFirstFailure, first.UTC().Format(time.RFC3339Nano))
}

// parseFirstFailure reads a [HeaderFirstFailure] found on a message: an RFC
// 3339 time not after now (a zero now checks no order). Anything else —
// empty, not a time, a first failure after the last — is not one.
func parseFirstFailure(v string, now time.Time) (time.Time, bool) {
	if v == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || (!now.IsZero() && t.After(now)) {
		return time.Time{}, false
	}
	return t, true
}

// MaxReasonLength bounds the [HeaderDeadLetterReason] header, in bytes.
const MaxReasonLength = 1024

// SanitizeReason makes an error text fit to be stored or shown beside a
// message: invalid UTF-8 is replaced with U+FFFD and the text is cut to
// [MaxReasonLength] bytes (ending in "…" when cut). [AnnotateDeadLetter]
// uses it for the dead-letter reason; brokers use it wherever they record a
// cause (a retry's last error), since an error may carry any bytes.
func SanitizeReason(s string) string {
	return cutText(s, MaxReasonLength)
}

// PrepareRedrive readies a dead-lettered message for its original queue: it
// removes the dead-letter headers, increments [HeaderRedriveCount] (as
// [RedriveCount] reads it: a forged count restarts at 1) and returns
// queue, the queue whose dead letters are being redriven, as the queue to
// publish to. The [HeaderDeadLetterQueue] header is never the target: a
// header can be forged by a producer or a foreign dead-letterer, while the
// dead-letter queue's owner is known from berth's own topology.
func PrepareRedrive(m *Message, queue string) string {
	n := RedriveCount(m)
	for _, h := range []string{HeaderDeadLetterReason, HeaderDeadLetterClass, HeaderDeadLetterAttempts,
		HeaderDeadLetterQueue, HeaderFirstFailure, HeaderLastFailure, HeaderAttempt, HeaderDeadLetterTruncated} {
		delete(m.Headers, h)
	}
	m.SetHeader(HeaderRedriveCount, strconv.Itoa(n+1))
	m.Delay = 0
	return queue
}

// RedriveCount returns how many times m was redriven: its
// [HeaderRedriveCount], read as the PostgreSQL broker's redrive reads it. A
// producer outside berth can set that header to anything, so a value that
// is not 1 to 9 ASCII digits (negative, signed, longer, not a number)
// counts as none, 0: [PrepareRedrive] then writes 1, and the job ledger
// numbers the job's generations from it, never backwards. Only a forged
// count of 999999999, redriven, reads as none again.
func RedriveCount(m *Message) int {
	v := m.Header(HeaderRedriveCount)
	if len(v) == 0 || len(v) > 9 {
		return 0
	}
	n := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// PublishError reports a batch that the broker accepted only in part. Failed
// holds the IDs of the messages that were not published, with their causes;
// the others were. It wraps the first cause.
type PublishError struct {
	Failed map[string]error
}

// Error names the failed messages (the first by ID when there are several).
func (e *PublishError) Error() string {
	if len(e.Failed) == 0 {
		return "berth: publish failed"
	}
	ids := make([]string, 0, len(e.Failed))
	for id := range e.Failed {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	if len(ids) == 1 {
		return "berth: publish failed for message " + ids[0] + ": " + e.Failed[ids[0]].Error()
	}
	return "berth: publish failed for " + strconv.Itoa(len(ids)) + " messages, e.g. " + ids[0] + ": " + e.Failed[ids[0]].Error()
}

// Unwrap returns the causes.
func (e *PublishError) Unwrap() []error {
	errs := make([]error, 0, len(e.Failed))
	for _, err := range e.Failed {
		errs = append(errs, err)
	}
	return errs
}

// TxPublisher publishes inside the caller's database transaction: the
// messages are published if and only if tx commits, so a business change and
// the jobs it calls for cannot part (no job for a rolled-back change, no
// change whose job was lost). Tx is the driver's transaction type — pgx.Tx
// for PostgreSQL — so that package sdk imports no database driver:
//
//	var pub sdk.TxPublisher[pgx.Tx] = postgresBroker // or an *outbox.Outbox
//
// The PostgreSQL broker implements it directly (the jobs are rows of tx);
// for every other broker the outbox implements it (rows of tx, relayed to
// the broker after commit). PublishTx validates msgs as [Publisher.Publish]
// does ([Prepare]; nothing is written when one is invalid) and neither
// commits nor rolls back tx. Package telemetry traces and counts it
// (telemetry.WrapTx) as it does Publish.
type TxPublisher[Tx any] interface {
	PublishTx(ctx context.Context, tx Tx, queue string, msgs ...*Message) error
}
