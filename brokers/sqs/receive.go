package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/berthq/berth/sdk"
)

// Receive long-polls queue for up to max messages (at most 10 per call) and
// leases them for [Options.VisibilityTimeout]. It implements
// [sdk.Subscriber]: on an empty queue it waits up to [Options.WaitTime] and
// returns an empty slice; it returns ctx.Err() when ctx is done and
// [sdk.ErrClosed] when the broker closes, even in the middle of a wait.
func (b *Broker) Receive(ctx context.Context, queue string, n int) ([]sdk.Delivery, error) {
	if b.closed.Load() {
		return nil, sdk.ErrClosed
	}
	n = min(max(n, 1), batchSize)
	ctx, done := b.watch(ctx)
	defer done()
	q, err := b.queue(ctx, queue)
	if err != nil {
		return nil, err
	}
	msgs, at, lost, err := b.receive(ctx, q, n, b.opts.VisibilityTimeout, b.opts.WaitTime)
	if lost != nil {
		// What the lost attempt took comes back after its visibility
		// timeout, one receive further on, as any unsettled delivery does.
		b.opts.Logger.Warn("berth/sqs: a receive attempt's answer was lost; messages it took return after the visibility timeout",
			"queue", q.name, "visibility", b.opts.VisibilityTimeout, "err", lost)
	}
	if err != nil {
		return nil, err
	}
	out := make([]sdk.Delivery, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, b.delivery(q, m, at))
	}
	return out, nil
}

// receive calls ReceiveMessage once, asking for every attribute, with a
// ReceiveRequestAttemptId of its own on a FIFO queue. at is when
// the call started: the leases run from no later than that. lost is the
// error of an attempt that may have reached SQS and taken messages whose
// answer never arrived (see [lostAttempt]) — one the SDK retried — or the
// call's own error when SQS refused the retries of such an attempt, or
// answered success and a check the SDK makes after its retries failed (the
// MD5 check of the bodies): those messages stay hidden for visibility.
// That error wraps [sdk.ErrUnavailable].
func (b *Broker) receive(ctx context.Context, q *queueRef, n int, visibility, wait time.Duration) (msgs []sqstypes.Message, at time.Time, lost, err error) {
	at = time.Now()
	var seen attempts
	in := &awssqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(q.url),
		MaxNumberOfMessages:         int32(n),
		VisibilityTimeout:           ceilSeconds(visibility),
		WaitTimeSeconds:             ceilSeconds(wait),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
	}
	if q.fifo {
		// One attempt ID for the call, which the SDK's retries send
		// again: SQS answers a retry of an attempt whose answer was lost
		// with the messages that attempt took (and their receipt
		// handles), rather than leaving them hidden for visibility and
		// their message groups blocked. A server that ignores it (the
		// emulator) leaves them hidden, so a lost attempt is still
		// reported as one.
		in.ReceiveRequestAttemptId = aws.String(sdk.NewID())
	}
	// A poll given up (ctx done, Close, an answer lost) may go on waiting
	// on the server, and take what this Broker hands back meanwhile: see
	// polls. A call that panics, or whose goroutine exits, counts as given
	// up.
	givenUp := true
	q.polls.begin(ctx, &seen, wait)
	defer func() { q.polls.end(&seen, givenUp) }()
	out, err := b.client.ReceiveMessage(ctx, in, watchAttempts(&seen), withBody)
	givenUp = err != nil && lostAttempt(err)
	if err != nil {
		// An attempt that may have taken messages (seen.uncertain): they
		// stay hidden for visibility, reported as lost.
		took, err := seen.uncertain(b.wrap(ctx, "receive from "+q.name, err))
		if took {
			return nil, at, err, err
		}
		return nil, at, nil, err
	}
	return out.Messages, at, seen.lostErr(), nil
}

// lostAttempt reports whether a failed attempt may have reached SQS and
// acted (taken messages, published) with its answer lost: it ended without
// SQS's status (a cut connection, a timeout, a cancelled long poll), its
// 2xx answer could not be read (answerCut), or a gateway between answered
// 502 or 504 (viaGateway: SQS never does, and may have had the request).
// SQS's own error status means it did nothing. It is the one definition of
// a lost answer: watchAttempts applies it to every attempt of a receive or
// a send.
func lostAttempt(err error) bool {
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) || re.Response == nil || re.Response.Response == nil {
		// No response at all: a failure before the request left (none
		// reaches watchAttempts' place past signing but a transport one or
		// the attempt's context) counts only if it is one of those.
		return isTransport(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
	}
	switch code := re.HTTPStatusCode(); {
	case code == 0:
		// smithy's stand-in response for a transport failure or the
		// attempt's context ending: no status came.
		return true
	case code < 300:
		return true // answerCut: SQS's success answer, unreadable
	default:
		return viaGateway(err)
	}
}

// message decodes m; a message whose berth attribute does not decode is
// delivered as a foreign one (raw body, attributes as headers) rather than
// lost, so that its handler can dead-letter it.
func (b *Broker) message(q *queueRef, m sqstypes.Message) *sdk.Message {
	msg, err := decode(m)
	if err != nil {
		b.opts.Logger.Warn("berth/sqs: undecodable message delivered as it is",
			slog.String("queue", q.name), slog.String("sqs_message_id", aws.ToString(m.MessageId)), sdk.LogCause("error", err)) // err quotes the envelope
		msg = foreign(m)
	}
	return msg
}

// receivedGroup is m's MessageGroupId: on a FIFO queue the group it was
// sent to, "" on a standard queue. A copy berth sends of m (its dead letter,
// its redrive) keeps that group rather than computing it again from the Key
// and this Broker's [Options.DefaultGroup], which another Broker (another
// service, another deployment) may have set differently: a message
// published without a Key would otherwise change group, and lose its FIFO
// order relative to the messages of the group it was published to.
func receivedGroup(m sqstypes.Message) string {
	return m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)]
}

// receiveCount is m's ApproximateReceiveCount, at least 1.
func receiveCount(m sqstypes.Message) int {
	n, err := strconv.Atoi(m.Attributes[string(sqstypes.MessageSystemAttributeNameApproximateReceiveCount)])
	if err != nil || n < 1 {
		return 1
	}
	return n
}

func (b *Broker) delivery(q *queueRef, m sqstypes.Message, at time.Time) *delivery {
	return &delivery{
		b:        b,
		q:        q,
		msg:      b.message(q, m),
		sqsID:    aws.ToString(m.MessageId),
		group:    receivedGroup(m),
		handle:   aws.ToString(m.ReceiptHandle),
		attempt:  receiveCount(m),
		received: at,
		deadline: at.Add(time.Duration(ceilSeconds(b.opts.VisibilityTimeout)) * time.Second),
	}
}

// Delivery states.
const (
	stateLeased  = iota
	stateSettled // acked, retried or dead-lettered
	stateLost    // the receipt handle went stale: another receive holds it
)

// delivery is one receipt of an SQS message.
type delivery struct {
	b        *Broker
	q        *queueRef
	msg      *sdk.Message
	sqsID    string
	group    string // the FIFO message group it was received with, "" on a standard queue
	handle   string
	attempt  int
	received time.Time

	mu       sync.Mutex // held across settlement calls
	deadline time.Time  // the lease ends no later than this
	state    int
}

var _ sdk.Delivery = (*delivery)(nil)

func (d *delivery) Message() *sdk.Message { return d.msg }
func (d *delivery) Attempt() int          { return d.attempt }
func (d *delivery) Queue() string         { return d.q.name }

// usable returns why d cannot be settled or extended, or nil. d.mu is held.
func (d *delivery) usable() error {
	switch {
	case d.state == stateSettled:
		return sdk.ErrAlreadySettled
	case d.state == stateLost:
		return leaseLost(d.msg.ID, nil)
	case d.b.closed.Load():
		return sdk.ErrClosed
	}
	return nil
}

// Ack deletes the message. The delete is buffered (see [Options.AckInterval]
// and [Options.SyncAck]). Once the lease may have run out, Ack first checks
// with ChangeMessageVisibility that the receipt still holds the message, and
// returns an error wrapping [sdk.ErrLeaseLost] when it does not. A buffered
// delete sent when the lease has run out, or is about to, is checked the same
// way first (SQS answers success to a delete whose receipt handle no longer
// holds the message, and deletes nothing): the delete of a stale receipt is
// not sent, and its error, wrapping [sdk.ErrLeaseLost], is returned by the
// next [Broker.Flush], or by Ack with SyncAck, as is a delete SQS refuses
// because the receipt handle expired. A delete whose call the SDK retried
// when the lease had run out, or was about to, fails with an error wrapping
// [sdk.ErrUnavailable]: SQS's success answer then says nothing, and the
// message may come back.
// A delete call that fails returns, like Publish, an error wrapping
// [sdk.ErrUnavailable] (SQS unreachable), [sdk.ErrNotFound] (no such queue)
// or [sdk.ErrClosed] (the broker closed).
func (d *delivery) Ack(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return err
	}
	if err := d.checkLease(ctx); err != nil {
		return err
	}
	var w *ackWaiter
	if d.b.opts.SyncAck {
		w = newAckWaiter()
	}
	if err := d.b.acks.add(ctx, d.q.url, ackEntry{queue: d.q.name, id: d.msg.ID, handle: d.handle, w: w, deadline: d.deadline, received: d.received}); err != nil {
		return sdk.ErrClosed
	}
	d.state = stateSettled
	if w == nil {
		return nil
	}
	err := w.wait(ctx)
	if errors.Is(err, sdk.ErrLeaseLost) {
		d.state = stateLost // nothing was deleted: another receipt holds it
	}
	return err
}

// Retry makes the message visible again after delay (rounded up to whole
// seconds) with ChangeMessageVisibility; its next receipt counts one more
// receive, hence Attempt()+1. cause is not kept: SQS cannot annotate a
// message in place. A delay that would end more than 12 hours after the
// receipt (SQS's ceiling, [MaxVisibility]) is clamped to what the ceiling
// allows, rounded down to whole seconds (0 once it has passed): this is how
// SQS applies [sdk.MaxDelay], which always ends after the ceiling since the
// receipt was earlier. Such a message comes back earlier than delay, by up
// to the time since its receipt; Retry cannot report the delay kept (it
// returns only an error), so a Worker's Settlement shows the delay asked for.
// While a long poll of the queue that this Broker gave up on (its Receive
// cancelled, or cut by Close, in the middle of its wait) may still be
// waiting on the server, the delay is at least what remains of that wait
// (plus a second, for the request's way to the server): the abandoned
// poll would otherwise take the message as soon as it is visible, counting
// a receive nobody sees and hiding it for the visibility timeout. A
// draining Worker cuts its idle polls before it hands back the work its
// interrupted handlers leave, so what it hands back may come back up to
// [Options.WaitTime] plus a second later than asked.
func (d *delivery) Retry(ctx context.Context, delay time.Duration, cause error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return err
	}
	// Not while a long poll this Broker gave up on may still wait on the
	// server: it would take the message at once, count a receive nobody
	// sees and hide it for the visibility timeout (see polls).
	delay = max(delay, d.q.polls.hold(time.Now()))
	if err := d.changeVisibility(ctx, delay, true); err != nil {
		return err
	}
	d.state = stateSettled
	return nil
}

// ExtendLease keeps the message invisible for dur from now (rounded up to
// whole seconds); a dur of zero or less means [Options.VisibilityTimeout],
// as on the memory broker: extending a lease never hands the message back
// (SQS deliveries are no [sdk.Releaser]). Past SQS's 12-hour ceiling it
// returns a [*LeaseCeilingError] and changes nothing.
func (d *delivery) ExtendLease(ctx context.Context, dur time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return err
	}
	if dur <= 0 {
		dur = d.b.opts.VisibilityTimeout
	}
	return d.changeVisibility(ctx, dur, false)
}

// DeadLetter sends a copy of the message, with the reason headers
// ([sdk.AnnotateDeadLetter]), to the dead-letter queue, then deletes the
// original. On a FIFO queue the copy keeps the message group the message
// was received with, whatever this Broker's [Options.DefaultGroup]. A copy over
// [Options.MaxWireSize], or over the dead-letter queue's own
// MaximumMessageSize when that is smaller, has its annotations shortened,
// never the message, and is marked [HeaderDeadLetterTruncated]; only a
// message Publish did not check (another producer's), or one whose
// dead-letter queue's limit is below its own queue's, can still be too
// large: a [*sdk.MessageTooLargeError], and the message stays in the queue.
// Once the lease may have run out, DeadLetter first checks that the receipt
// still holds the message (as Ack does), and returns an error wrapping
// [sdk.ErrLeaseLost] with nothing sent when it does not. A delete SQS
// refuses because the receipt handle expired, or one sent after the lease
// ran out whose receipt no longer holds the message (see Ack: the lease ran
// out while the copy was being sent), returns an error wrapping
// [sdk.ErrLeaseLost] too, after DeadLetter took the copy back out of the
// dead-letter queue ([Broker.DeleteDeadLetters] of the copy's SQS
// MessageId, a scan of that queue): the original comes back, or already
// runs on another receive, and a letter left in the dead-letter queue would
// be one of a job still live (a redrive would run it twice). When the copy
// cannot be taken back, the error (wrapping sdk.ErrLeaseLost) says so and
// names it, and it is logged. A delete call that fails otherwise is mapped
// as Ack's is, and the copy stays (the original comes back and is
// dead-lettered again).
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return err
	}
	if err := d.checkLease(ctx); err != nil {
		return err
	}
	dlq, err := d.b.deadLetterQueue(ctx, d.q)
	if err != nil {
		return err
	}
	m := d.msg.Clone()
	m.Delay = 0
	sdk.AnnotateDeadLetter(m, d.q.name, d.attempt, cause, time.Time{}, time.Now())
	// The dead-letter queue's own limit when it is below MaxWireSize (a
	// queue made outside berth, or by a broker with a smaller MaxWireSize).
	limit, err := d.b.wireLimit(ctx, dlq)
	if err != nil {
		return err
	}
	salt := "dlq-" + d.sqsID + "-" + strconv.Itoa(d.attempt)
	e, err := d.b.entry(m, dlq.fifo, d.group, salt, limit)
	if tooLarge := (*sdk.MessageTooLargeError)(nil); errors.As(err, &tooLarge) {
		// Shorten the annotations, never the message (see fitDeadLetter).
		if err = fitDeadLetter(m, limit); err == nil {
			e, err = d.b.entry(m, dlq.fifo, d.group, salt, limit)
		}
	}
	if err != nil {
		return err
	}
	var copyID string // the copy's SQS MessageId
	e.sent = &copyID
	if err := d.b.send(ctx, dlq, []sendEntry{e}); err != nil {
		return err
	}
	// The copy is in the dead-letter queue: from here on the delivery is
	// settled, even if the delete fails (the original would then come back
	// and be dead-lettered again).
	d.state = stateSettled
	w := newAckWaiter()
	if err := d.b.acks.add(ctx, d.q.url, ackEntry{queue: d.q.name, id: d.msg.ID, handle: d.handle, w: w, deadline: d.deadline, received: d.received}); err != nil {
		return sdk.ErrClosed
	}
	err = w.wait(ctx)
	if errors.Is(err, sdk.ErrLeaseLost) {
		// The lease ran out while the copy was on its way: the original
		// is not deleted, and another receive may hold it already. A
		// settlement after the lease was lost changes nothing, so the
		// copy is taken back: left in the dead-letter queue, it would be
		// a dead letter of a job that still runs (a redrive would run it
		// twice).
		d.state = stateLost
		return d.withdraw(ctx, copyID, err)
	}
	return err
}

// withdraw deletes from the dead-letter queue the copy (SQS MessageId
// copyID) that DeadLetter sent before its delete of the original failed
// with lost, an error wrapping [sdk.ErrLeaseLost], and returns lost, or,
// when the copy could not be deleted, lost joined with why (the copy
// stays, and is logged). d.mu is held.
func (d *delivery) withdraw(ctx context.Context, copyID string, lost error) error {
	err := errors.New("SQS did not name the copy it took")
	if copyID != "" {
		var n int
		n, err = d.b.DeleteDeadLetters(ctx, d.q.name, copyID)
		if err == nil && n != 1 { // found, but another reader took it meanwhile
			err = errors.New("another reader of the dead-letter queue held it")
		}
	}
	if err == nil {
		return lost
	}
	err = fmt.Errorf("berth/sqs: the lease of message %s was lost after its dead letter was sent, and the dead letter (SQS MessageId %s) stays in the dead-letter queue of %s: %w",
		sdk.ErrorText(d.msg.ID), copyID, d.q.name, err)
	d.b.opts.Logger.Warn("berth/sqs: a dead letter was sent for a message whose lease was lost, and could not be taken back",
		slog.String("queue", d.q.name), sdk.LogText("message_id", d.msg.ID), slog.String("sqs_message_id", copyID), sdk.LogCause("error", err))
	return errors.Join(lost, err)
}

// checkLease makes sure, once the lease may have run out, that the receipt
// still holds the message, by extending its visibility. d.mu is held.
func (d *delivery) checkLease(ctx context.Context) error {
	if time.Now().Before(d.deadline) {
		return nil
	}
	return d.changeVisibility(ctx, d.b.opts.VisibilityTimeout, false)
}

// changeVisibility sets the message's visibility timeout to dur from now.
// Beyond the 12-hour ceiling it returns a [*LeaseCeilingError], or with
// clamp sets what the ceiling allows in whole seconds (at least 0) instead.
// d.mu is held.
func (d *delivery) changeVisibility(ctx context.Context, dur time.Duration, clamp bool) error {
	secs := ceilSeconds(dur)
	now := time.Now()
	if now.Add(time.Duration(secs)*time.Second).Sub(d.received) > MaxVisibility {
		if !clamp {
			return &LeaseCeilingError{ID: d.msg.ID, Requested: dur, Received: d.received}
		}
		secs = int32(max(d.received.Add(MaxVisibility).Sub(now)/time.Second, 0))
	}
	ctx, done := d.b.watch(ctx)
	defer done()
	_, err := d.b.client.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{
		QueueUrl:          aws.String(d.q.url),
		ReceiptHandle:     aws.String(d.handle),
		VisibilityTimeout: secs,
	}, withBody)
	next := now.Add(time.Duration(secs) * time.Second)
	if err != nil {
		if isStaleReceipt(err) {
			d.state = stateLost
			return leaseLost(d.msg.ID, err)
		}
		// A failed call may have been applied all the same (its answer
		// lost): a shorter visibility may hold from now on, and an Ack
		// trusting the longer deadline would send the delete of a receipt
		// another receive may have replaced, which SQS answers with success
		// and ignores. The earlier of the two is the deadline now.
		if next.Before(d.deadline) {
			d.deadline = next
		}
		return d.b.wrap(ctx, "change visibility of message "+sdk.ErrorText(d.msg.ID), err)
	}
	d.deadline = next
	return nil
}
