package jetstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/sdk"
)

// delivery is one JetStream delivery of a message.
type delivery struct {
	b         *Broker
	q         *queueState
	msg       *sdk.Message
	extra     nats.Header // the stored message's foreign NATS headers, kept by every copy
	reply     string      // the $JS.ACK subject of this delivery
	seq       uint64      // stream sequence
	stored    time.Time   // when the stream stored it (with seq, names it across a recreate)
	delivered uint64      // JetStream's NumDelivered
	attempt   int

	mu       sync.Mutex
	settled  bool
	deadline time.Time   // berth's view of when the lease ends
	until    time.Time   // the end ExtendLease asked for
	renew    *time.Timer // repeats InProgress until until, nil when none
	// renewing is closed once the +WPI renewLease has on its way is
	// answered or given up; nil when none is.
	renewing chan struct{}
}

var _ sdk.Releaser = (*delivery)(nil)

func (d *delivery) Message() *sdk.Message { return d.msg }
func (d *delivery) Attempt() int          { return d.attempt }
func (d *delivery) Queue() string         { return d.q.name }

// LeaseLostError reports a settlement refused because the delivery's lease
// (AckWait) ended: JetStream may have handed the message to another
// consumer. It wraps [sdk.ErrLeaseLost].
type LeaseLostError struct {
	Queue, ID string
	Ended     time.Time
}

func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("berth/jetstream: message %s of queue %s: lease ended at %s", sdk.ErrorText(e.ID), e.Queue, e.Ended.Format(time.RFC3339Nano))
}

// Unwrap returns [sdk.ErrLeaseLost].
func (e *LeaseLostError) Unwrap() error { return sdk.ErrLeaseLost }

// begin checks that d can be settled: not yet settled, lease not over. It
// holds d.mu until end is called.
//
// It first waits (as long as ctx lets it) for a +WPI of the lease timer on
// its way: a settlement sent meanwhile could reach the server first, and
// the +WPI, applied after a Retry's delayed nak, restarts the message's
// AckWait: it came back after AckWait instead of the delay.
func (d *delivery) begin(ctx context.Context) error {
	d.mu.Lock()
	for d.renewing != nil {
		renewing := d.renewing
		d.mu.Unlock()
		select {
		case <-renewing:
		case <-ctx.Done():
			return ctx.Err()
		}
		d.mu.Lock()
	}
	if d.b.closed.Load() {
		d.mu.Unlock()
		return sdk.ErrClosed
	}
	if d.settled {
		d.mu.Unlock()
		return sdk.ErrAlreadySettled
	}
	if time.Now().After(d.deadline) {
		d.mu.Unlock()
		return &LeaseLostError{Queue: d.q.name, ID: d.msg.ID, Ended: d.deadline}
	}
	return nil
}

// end releases d.mu, marking d settled when err is nil.
func (d *delivery) end(err error) error {
	if err == nil {
		d.settled = true
		if d.renew != nil {
			d.renew.Stop()
			d.renew = nil
		}
	}
	d.mu.Unlock()
	return err
}

// settleTimeout bounds a settlement whose ctx has no deadline.
const settleTimeout = 10 * time.Second

// send sends a settlement on the delivery's ack subject as a request, and
// returns once JetStream has answered it (its "double ack"), so that a nil
// error means the server has it: a settlement merely buffered would be lost
// with the connection, and the message would come back though its Ack
// returned nil. While the connection is down it is refused at once with
// sdk.ErrUnavailable instead of being buffered.
func (d *delivery) send(ctx context.Context, op string, body []byte) error {
	if err := d.b.connected(op); err != nil {
		return err
	}
	if d.b.opts.AsyncAck {
		if err := d.b.nc.Publish(d.reply, body); err != nil {
			return d.b.wrapErr(ctx, op, err)
		}
		return nil
	}
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		rctx, cancel = context.WithTimeout(ctx, settleTimeout)
	}
	defer cancel()
	if _, err := d.b.nc.RequestWithContext(rctx, d.reply, body); err != nil {
		if ctx.Err() == nil && rctx.Err() != nil {
			return fmt.Errorf("berth/jetstream: %s: %w: no answer within %s", op, sdk.ErrUnavailable, settleTimeout)
		}
		return d.b.wrapErr(ctx, op, err)
	}
	return nil
}

// sendInLease is send for a delivery's settlement or +WPI (d.mu held),
// which must be answered within d's lease: JetStream applies an
// acknowledgement that reaches it after it redelivered the message to
// another consumer to that consumer's delivery (a +ACK removes the message
// under it, a -NAK has it delivered a third time, a +WPI extends its
// lease), and answers it as any other. An answer that does not come before
// the lease's end is therefore a [*LeaseLostError], as is a lease that
// ended before the send (a Release's or DeadLetter's copy stored late):
// the server may have redelivered the message, and the settlement may or
// may not have been applied. Without [Options.AsyncAck] only: an
// acknowledgement not waited for is not known to have been applied late.
func (d *delivery) sendInLease(ctx context.Context, op string, body []byte) error {
	_, err := d.trySendInLease(ctx, op, body)
	return err
}

// trySendInLease is sendInLease, reporting also whether the lease had
// ended before the send: then nothing was sent, and err is a
// [*LeaseLostError].
func (d *delivery) trySendInLease(ctx context.Context, op string, body []byte) (ended bool, err error) {
	start := time.Now()
	if !start.Before(d.deadline) {
		return true, &LeaseLostError{Queue: d.q.name, ID: d.msg.ID, Ended: d.deadline}
	}
	return false, d.sendBefore(ctx, op, body, start)
}

// sendBefore is sendInLease's send, started at start, within the lease.
func (d *delivery) sendBefore(ctx context.Context, op string, body []byte, start time.Time) error {
	if d.b.opts.AsyncAck {
		return d.send(ctx, op, body)
	}
	until := d.deadline
	if _, ok := ctx.Deadline(); !ok && start.Add(settleTimeout).Before(until) {
		until = start.Add(settleTimeout)
	}
	rctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	if err := d.send(rctx, op, body); err != nil {
		if ctx.Err() == nil && rctx.Err() != nil {
			if !time.Now().Before(d.deadline) {
				return &LeaseLostError{Queue: d.q.name, ID: d.msg.ID, Ended: d.deadline}
			}
			return fmt.Errorf("berth/jetstream: %s: %w: no answer within %s", op, sdk.ErrUnavailable, settleTimeout)
		}
		return err
	}
	return nil
}

// Ack sends +ACK and waits for JetStream's answer: the message is removed
// (work-queue retention). An answer that comes only after the lease ended
// is a [*LeaseLostError] (see sendInLease).
func (d *delivery) Ack(ctx context.Context) error {
	if err := d.begin(ctx); err != nil {
		return err
	}
	return d.end(d.sendInLease(ctx, "ack", ackAck))
}

// Retry sends -NAK with the delay: JetStream redelivers the message, with
// NumDelivered (hence Attempt) one higher, not before delay. cause is not
// stored: JetStream keeps no text with a nak.
func (d *delivery) Retry(ctx context.Context, delay time.Duration, _ error) error {
	if err := d.begin(ctx); err != nil {
		return err
	}
	delay = min(max(delay, 0), sdk.MaxDelay)
	return d.end(d.sendInLease(ctx, "nak", nakDelay(delay)))
}

// ExtendLease sends +WPI (in progress) and, unless [Options.AsyncAck], waits
// for JetStream's answer: JetStream restarts the delivery's AckWait. An
// answer that comes only after the lease has ended renews nothing:
// ExtendLease then returns a [*LeaseLostError]. JetStream has no lease of
// another length, so when d is longer than AckWait berth sends +WPI again
// every AckWait/2 until d has passed (from a timer, stopped when the
// delivery is settled or the Broker closed). The lease then ends between d
// and d+AckWait from now.
func (d *delivery) ExtendLease(ctx context.Context, dur time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.b.closed.Load():
		return sdk.ErrClosed
	case d.settled:
		return sdk.ErrAlreadySettled
	case time.Now().After(d.deadline):
		return &LeaseLostError{Queue: d.q.name, ID: d.msg.ID, Ended: d.deadline}
	}
	start := time.Now()
	// The answer must come within the lease held now, as the lease timer's
	// (renewLease): one that comes after its end may answer a +WPI that
	// reached the server after it had redelivered the message (restarting
	// the other holder's AckWait), and renews nothing of this delivery.
	if err := d.sendInLease(ctx, "in progress", ackProgress); err != nil {
		return err
	}
	d.deadline = start.Add(d.b.leaseFor())
	d.until = start.Add(dur)
	if d.renew != nil {
		d.renew.Stop()
		d.renew = nil
	}
	if dur > d.b.opts.AckWait {
		d.renew = time.AfterFunc(d.b.opts.AckWait/2, d.renewLease)
	}
	return nil
}

// renewLease is ExtendLease's timer: one more +WPI while the asked-for end
// is not reached. The +WPI is a request, and berth's lease moves only once
// JetStream has answered it: a +WPI merely buffered by nats.go (while it
// reconnects) may never reach the server, which would then redeliver the
// message while berth believed it held the lease. A renewal that fails is
// tried again shortly, as long as the lease it has runs.
func (d *delivery) renewLease() {
	d.mu.Lock()
	now := time.Now()
	if d.settled || d.renew == nil || d.b.closed.Load() || now.After(d.deadline) || !now.Before(d.until) {
		d.renew = nil
		d.mu.Unlock()
		return
	}
	timer, deadline := d.renew, d.deadline
	renewing := make(chan struct{})
	d.renewing = renewing
	d.mu.Unlock()

	// Without d.mu: ExtendLease need not wait for the answer (a
	// settlement does, see begin). Past the lease's end the answer is of
	// no use.
	err := d.b.connected("in progress")
	if err == nil {
		if renewHook != nil {
			renewHook()
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		go func() { // Close ends the wait
			select {
			case <-d.b.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		_, err = d.b.nc.RequestWithContext(ctx, d.reply, ackProgress)
		cancel()
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.renewing == renewing { // else another renewal is on its way
		d.renewing = nil
	}
	close(renewing)
	if d.settled || d.renew != timer {
		return // settled, or ExtendLease started anew, meanwhile
	}
	if err != nil {
		if d.b.closed.Load() || !time.Now().Before(d.deadline) {
			d.renew = nil
			return
		}
		d.renew.Reset(min(d.b.opts.AckWait/20, 100*time.Millisecond))
		return
	}
	d.deadline = now.Add(d.b.leaseFor())
	if d.until.Sub(now) > d.b.opts.AckWait {
		// Half an AckWait from the send, not from the answer: a slow
		// answer must not push the next renewal past the lease's end.
		d.renew.Reset(max(d.b.opts.AckWait/2-time.Since(now), 0))
	} else {
		d.renew = nil
	}
}

// renewHook, set by the tests, runs in renewLease just before its +WPI is
// sent.
var renewHook func()

// DeadLetter stores a copy with the reason headers in the queue's
// dead-letter stream (waiting for its ack), then acknowledges the original,
// within the lease (see sendInLease).
//
// When the lease ran out while the copy was being stored, the original is
// not acknowledged (it comes back, or already runs on another consumer):
// DeadLetter then deletes the copy it stored from the dead-letter stream
// (by the stream sequence its publish ack gave), and returns a
// [*LeaseLostError]; a dead letter left there would be one of a job still
// live, which a redrive would run twice. When the copy cannot be deleted,
// the error (still wrapping [sdk.ErrLeaseLost]) says so and names it, and
// it is logged. An acknowledgement sent but not answered within the lease
// may have been applied: the copy stays then, as it does when the
// acknowledgement fails (the original comes back and is dead-lettered
// again, a copy JetStream drops as a duplicate).
//
// A copy JetStream drops as a duplicate (of an earlier DeadLetter of the
// message, within the stream's Duplicates window) whose earlier copy is no
// longer in the dead-letter stream (taken back as above, or deleted,
// purged or redriven since) is stored again under the next of a series of
// IDs of the original's (see storeAgain), so that the original is never
// acknowledged without a dead letter, and a later delivery of the message
// whose DeadLetter's copy this is finds it a duplicate too.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	return d.deadLetter(ctx, cause, d.attempt)
}

func (d *delivery) deadLetter(ctx context.Context, cause error, attempts int) error {
	if err := d.begin(ctx); err != nil {
		return err
	}
	m := d.msg.Clone()
	sdk.AnnotateDeadLetter(m, d.q.name, attempts, cause, time.Time{}, time.Now())
	if attempts <= 0 {
		delete(m.Headers, sdk.HeaderDeadLetterAttempts)
	}
	// The store time is part of the ID: the dead-letter stream outlives a
	// queue stream deleted and created again (sequences from 1 again), and
	// within its Duplicates window would drop, as a duplicate, the dead
	// letter of a new message at the sequence of one dead-lettered before,
	// whose original the ack below then deletes: a job lost.
	id := internalID(idDeadLetter, d.q.stream, d.seq, uint64(d.stored.UnixNano()))
	subject := d.q.dead + "." + idToken(m.ID)
	w, err := d.b.fitDeadLetter(m, d.extra, subject, id)
	if err != nil {
		return d.end(err)
	}
	pa, err := d.b.publishAcked(ctx, w, id)
	if streamGone(err) {
		// No stream answered: the dead-letter stream was deleted (by an
		// operator, to empty it) after this Broker declared the queue, or
		// it is electing a leader. Declared again when it is missing, as
		// Publish does with the queue's stream (recheck); else every
		// DeadLetter and every poison message failed until the Broker was
		// replaced, the message delivered again for ever. A stream without
		// a leader is ErrUnavailable at once: the message comes back after
		// its AckWait, where the declaration used to wait out the
		// settlement's context.
		if _, derr := d.b.recheck(ctx, d.q); derr != nil {
			return d.end(derr)
		}
		pa, err = d.b.publishAcked(ctx, w, id)
	}
	if err == nil && pa.Duplicate {
		pa, err = d.storeAgain(ctx, m, subject, pa)
	}
	if err != nil {
		return d.end(err)
	}
	if deadLetterHook != nil {
		deadLetterHook()
	}
	ended, err := d.trySendInLease(ctx, "ack", ackAck)
	if ended {
		// The lease ran out while the copy was being stored: the original
		// is not acked, and comes back or already runs elsewhere.
		return d.end(d.takeBack(ctx, err, pa.Sequence))
	}
	return d.end(err)
}

// maxStoreAgain bounds how many times storeAgain stores a dead letter again
// under a new ID (see storeAgain).
const maxStoreAgain = 16

// storeAgain is called when DeadLetter's copy of m (on subject) was dropped
// as a duplicate (pa), of the copy an earlier DeadLetter of the message
// stored (whose ack of the original was lost): that copy is its dead
// letter, unless it is gone (taken back by a DeadLetter whose lease ran
// out, see takeBack, or deleted, purged or redriven since), and the ack of the
// original would then leave none. A copy gone is stored again under the
// next ID of a series of the original's (its stream, sequence and store
// time, and 1, 2, …), not one of this delivery: a later delivery of the
// message (this one's ack lost in turn) must find that copy a duplicate
// too, and store no second dead letter, which a redrive would run twice.
// It returns the publish ack of the copy that stands for the dead letter,
// or an error after maxStoreAgain copies gone (the original comes back,
// and its DeadLetter stores it as new once the Duplicates window passed).
func (d *delivery) storeAgain(ctx context.Context, m *sdk.Message, subject string, pa *jetstream.PubAck) (*jetstream.PubAck, error) {
	for k := uint64(1); ; k++ {
		gone, err := d.b.letterGone(ctx, d.q.dlq, pa.Sequence)
		if err != nil || !gone {
			return pa, err
		}
		if k > maxStoreAgain {
			return nil, fmt.Errorf("berth/jetstream: dead letter of message %s of queue %s: %d copies stored again are gone within the dead-letter stream's Duplicates window: %w",
				sdk.ErrorText(d.msg.ID), d.q.name, maxStoreAgain, sdk.ErrUnavailable)
		}
		id := internalID(idDeadLetter, d.q.stream, d.seq, uint64(d.stored.UnixNano()), k)
		w, err := d.b.fitDeadLetter(m, d.extra, subject, id)
		if err != nil {
			return nil, err
		}
		if pa, err = d.b.publishAcked(ctx, w, id); err != nil || !pa.Duplicate {
			return pa, err
		}
	}
}

// deadLetterHook, set by the tests, runs in DeadLetter once the copy is
// stored, before the original is acknowledged.
var deadLetterHook func()

// takeBack deletes the copy DeadLetter stored at sequence seq of the
// dead-letter stream, whose original it did not acknowledge because the
// lease had ended (lost, a *LeaseLostError), and returns lost. When the
// copy cannot be deleted, it logs that and returns an error wrapping lost
// that says so.
func (d *delivery) takeBack(ctx context.Context, lost error, seq uint64) error {
	s, err := d.b.js.Stream(ctx, d.q.dlq)
	if err == nil {
		// Not there (false): deleted, purged or redriven meanwhile.
		_, err = d.b.take(ctx, s, seq)
	}
	if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
		return lost
	}
	err = d.b.wrapErr(ctx, "take back dead letter", err)
	d.b.opts.Logger.Error("berth/jetstream: the dead letter of a message whose lease ran out while it was stored could not be deleted: a redrive would run the job again",
		"queue", d.q.name, sdk.LogText("id", d.msg.ID), "stream", d.q.dlq, "seq", seq, "err", err)
	return fmt.Errorf("%w; its dead letter (stream %s, sequence %d) stays, not deleted: %v", lost, d.q.dlq, seq, err)
}

// letterGone reports whether the message at sequence seq of dead-letter
// stream dlq is no longer there.
func (b *Broker) letterGone(ctx context.Context, dlq string, seq uint64) (bool, error) {
	s, err := b.js.Stream(ctx, dlq)
	if err == nil {
		_, err = s.GetMsg(ctx, seq)
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true, nil
	}
	if err != nil {
		return false, b.wrapErr(ctx, "read dead letter", err)
	}
	return false, nil
}

// HeaderDeadLetterTruncated marks a dead letter whose annotations berth
// shortened so that it fits the server's max_payload (see
// [sdk.HeaderDeadLetterTruncated]). A redrive removes it.
const HeaderDeadLetterTruncated = sdk.HeaderDeadLetterTruncated

// fitDeadLetter encodes m, annotated as a dead letter, on subject, as it is
// stored with Nats-Msg-Id id. When it is over the server's max_payload it
// shortens the annotations berth added, never the message
// ([sdk.FitDeadLetter]): first the reason (cut to fit, or left out), then
// every annotation, and marks the copy with [HeaderDeadLetterTruncated]. A
// dead letter with a short reason is better than one that cannot be
// stored, whose message would be delivered again for ever. Publish keeps
// room for the shortest form ([copyReserve]), so only a foreign producer's
// message can still be too large: a [*sdk.MessageTooLargeError], and the
// message stays where it is.
//
// It costs nothing more while the copy fits (the size check Publish also
// makes); a copy that does not is encoded a few more times.
func (b *Broker) fitDeadLetter(m *sdk.Message, extra nats.Header, subject, id string) (*nats.Msg, error) {
	var w *nats.Msg // the last encoding: m's as FitDeadLetter leaves it
	err := sdk.FitDeadLetter(m, b.payloadLimit(), func(m *sdk.Message) (int, error) {
		var err error
		if w, err = encode(m, extra, subject, 1, time.Time{}); err != nil {
			return 0, err
		}
		return wireSize(w, id), nil
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Release hands the message back without consuming an attempt. JetStream
// counts every delivery of a stored message (a nak would too), so berth
// stores a new copy whose first delivery counts as this delivery's attempt
// (on the delayed subject when delay > 0), waits for its ack, then
// acknowledges this one, within the lease (see sendInLease). Should the ack
// be lost, or the lease end first, both copies are delivered: consumers
// dedupe by IdempotencyKey.
func (d *delivery) Release(ctx context.Context, delay time.Duration) error {
	if err := d.begin(ctx); err != nil {
		return err
	}
	delay = min(max(delay, 0), sdk.MaxDelay)
	subject, notBefore := d.q.ready, time.Time{}
	if delay > 0 {
		subject, notBefore = d.q.delayed, time.Now().Add(delay)
	}
	w, err := encode(d.msg, d.extra, subject, d.attempt, notBefore)
	if err != nil {
		return d.end(err)
	}
	id := internalID(idRelease, d.q.stream, d.seq, d.delivered)
	if err := d.b.publishOne(ctx, d.q.stream, w, id); err != nil {
		return d.end(err)
	}
	return d.end(d.sendInLease(ctx, "ack", ackAck))
}
