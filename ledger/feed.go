package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/berthq/berth/sdk"
)

// Start records that d's attempt started (status running). It is the
// [sdk.Observer] half the Worker calls before the handler; it returns ctx
// with the start time, which Settled reads (see startKey).
//
// A delivery that is not due yet (its [sdk.HeaderDueAt] is after now) is
// most likely an [sdk.LongDelay] hop, not an attempt: nothing is recorded,
// and the context carries [sdk.WithHopNotice]'s notice, by which Settled
// learns whether the middleware hopped it (the job then waits for its due
// time) or ran the handler (the due time passed meanwhile: the attempt is
// recorded then, with its start).
func (l *Ledger) Start(ctx context.Context, d sdk.Delivery) context.Context {
	m := d.Message()
	now := time.Now()
	if _, ok := hopDue(m, now); ok {
		ctx, hopped := sdk.WithHopNotice(ctx)
		return context.WithValue(context.WithValue(ctx, startKey{}, now), hopKey{}, hopped)
	}
	e := base(m, d.Queue())
	e.Status, e.Attempt, e.At, e.StartedAt, e.Worker = StatusRunning, d.Attempt(), now, now, l.worker
	l.Record(e)
	return context.WithValue(ctx, startKey{}, now)
}

// startKey holds, in the handler's context, when Start recorded the
// attempt running. Settled records it as its event's start, so that every
// event of one delivery carries the same start, and the store orders the
// events of two deliveries of one attempt by it (see the package doc). A
// release is ordered against its own running by time (same start, same
// rank), and Settled reports it only once the broker has taken it — by
// then the broker may have handed the message again, at the same attempt,
// and that start been recorded. So a release is dated when its handler
// ended (the start plus the handler's run time), before the release call
// and so before any redelivery, yet after its own start.
type startKey struct{}

// hopKey holds, in the context of a delivery Start took for a hop, the
// hopped of its [sdk.WithHopNotice].
type hopKey struct{}

// Settled records how d's attempt ended: succeeded (ack), retrying with its
// next attempt time (retry), dead (dead letter), released (handed back).
//
// The ack of an [sdk.LongDelay] hop (the middleware republished the
// message for later and acked it; the handler did not run, which the
// middleware tells through [sdk.WithHopNotice]) is recorded as the job
// enqueued, due at its [sdk.HeaderDueAt], at attempt 0 — never as its
// success.
//
// Two endings leave the message with the broker, which delivers it again;
// both are recorded with no next attempt time (the broker decides when) and
// an error that says what happened:
//   - a lost lease ([sdk.ActionLeaseLost]): retrying; the error is
//     [sdk.ErrLeaseLost]'s text, with the handler's error if it returned
//     one, class [ClassLeaseLost];
//   - a settlement whose call failed (Settlement.Err): the error names the
//     settlement that failed and why, then the handler's error if any,
//     class [ClassSettleFailed]. An ack, retry or dead letter that failed
//     is recorded retrying; a release that failed, released (dated when
//     its handler ended, as a release is): a release spends no attempt, and
//     one that failed may have handed the message back all the same (a
//     copy sent, then its ack lost), so the broker may deliver it again at
//     the same attempt, whose start must replace it — retrying ends its
//     attempt. A settlement that failed on the wire may still have reached
//     the broker; then no attempt follows and the row keeps this state,
//     which says exactly that.
//
// The next attempt's events replace either (a later attempt is newer; so is
// a later delivery of the same attempt: after a failed release, or a lost
// lease on a RabbitMQ classic queue, whose redelivery keeps the attempt),
// and this attempt stays in the job's history (as its attempt: a later
// delivery of the same attempt takes its place there).
func (l *Ledger) Settled(ctx context.Context, d sdk.Delivery, s sdk.Settlement) {
	m := d.Message()
	now := time.Now()
	e := base(m, d.Queue())
	e.Attempt, e.At, e.Worker, e.Duration = d.Attempt(), now, l.worker, s.Duration
	// The start Start recorded, exactly: the store tells this delivery's
	// events from another delivery's of the same attempt (a RabbitMQ
	// classic queue's redelivery) by their start.
	if started, ok := ctx.Value(startKey{}).(time.Time); ok {
		e.StartedAt = started
	} else if s.Duration > 0 {
		e.StartedAt = now.Add(-s.Duration)
	}
	if s.Cause != nil {
		e.Error, e.Class = reason(s.Cause), s.Class
	}
	switch {
	case s.Action == sdk.ActionLeaseLost:
		e.Status, e.Class = StatusRetrying, ClassLeaseLost
		e.Error = reason(withCause(sdk.ErrLeaseLost.Error(), s.Cause))
		l.Record(e)
		return
	case s.Err != nil:
		e.Status, e.Class = StatusRetrying, ClassSettleFailed
		e.Error = reason(withCause(string(s.Action)+" failed: "+s.Err.Error(), s.Cause))
		if s.Action == sdk.ActionRelease {
			// A release spends no attempt, and one that failed may have
			// handed the message back all the same (a copy sent, then the
			// ack lost): the broker may deliver it again at this attempt.
			// Retrying would end the attempt (rank 2) and hide that
			// delivery's events; released, dated as a release is, does not.
			e.Status, e.At = StatusReleased, releasedAt(ctx, s, now)
		}
		l.Record(e)
		return
	}
	switch s.Action {
	case sdk.ActionAck:
		if hopped, _ := ctx.Value(hopKey{}).(func() bool); hopped != nil && hopped() {
			due, _ := hopDue(m, time.Time{})
			// A hop: the job waits for its due time, as when it was
			// published (no attempt, no start, no run time).
			l.Record(Event{MessageID: e.MessageID, Queue: e.Queue, Type: e.Type, IdempotencyKey: e.IdempotencyKey,
				CorrelationID: e.CorrelationID, Generation: e.Generation, Status: StatusEnqueued, At: now, NextAttemptAt: due})
			return
		}
		e.Status = StatusSucceeded
	case sdk.ActionRetry:
		e.Status, e.NextAttemptAt = StatusRetrying, now.Add(s.Delay)
	case sdk.ActionDeadLetter:
		e.Status = StatusDead
	case sdk.ActionRelease:
		e.Status, e.NextAttemptAt, e.At = StatusReleased, now.Add(s.Delay), releasedAt(ctx, s, now)
	default:
		return
	}
	l.Record(e)
}

// releasedAt is when a release settled at now is dated (see startKey): when
// its handler ended, read from the start Start put in ctx; now when ctx
// holds none, or that time is not before now.
func releasedAt(ctx context.Context, s sdk.Settlement, now time.Time) time.Time {
	if started, ok := ctx.Value(startKey{}).(time.Time); ok {
		// The store keeps microseconds: at least one after the start, so
		// an instant release still ends its own running.
		if at := started.Add(max(s.Duration, time.Microsecond)); at.Before(now) {
			return at
		}
	}
	return now
}

// Error classes the ledger records for attempts that ended without a
// settlement; the handler's own class is in the error text then.
const (
	// ClassLeaseLost marks an attempt whose lease was lost: the Worker did
	// not settle it and the broker delivers the message again.
	ClassLeaseLost sdk.ErrorClass = "lease_lost"
	// ClassSettleFailed marks an attempt whose settlement call (ack, retry,
	// dead letter, release) returned an error.
	ClassSettleFailed sdk.ErrorClass = "settle_failed"
)

// withCause is what, then the handler's error when there was one.
func withCause(what string, cause error) error {
	if cause == nil {
		return errors.New(what)
	}
	return fmt.Errorf("%s (handler error: %w)", what, cause)
}

// hopDue returns m's [sdk.HeaderDueAt] when it is a valid time after at:
// a delivery of m started at at is an [sdk.LongDelay] hop. A message
// without headers costs a nil-map lookup.
func hopDue(m *sdk.Message, at time.Time) (time.Time, bool) {
	v := m.Header(sdk.HeaderDueAt)
	if v == "" {
		return time.Time{}, false
	}
	due, err := time.Parse(time.RFC3339Nano, v)
	return due, err == nil && due.After(at)
}

// jobID is the ID the ledger knows m's job by: m's own, or for an
// [sdk.LongDelay] hop the job's first message's ([sdk.HeaderHopOf]), so
// that the hops of one job are one row.
func jobID(m *sdk.Message) string {
	if id := m.Header(sdk.HeaderHopOf); id != "" {
		return id
	}
	return m.ID
}

// base is the part of an event every feed knows from the message.
func base(m *sdk.Message, queue string) Event {
	// The count as a redrive reads it (sdk.RedriveCount): a forged one,
	// negative or past the store's bound, read otherwise here than by
	// sdk.PrepareRedrive, numbered the redriven job's generation at or
	// below the row's, and its events were dropped as older.
	return Event{
		MessageID: jobID(m), Queue: queue, Type: m.Type, IdempotencyKey: m.IdempotencyKey,
		CorrelationID: m.CorrelationID, Generation: sdk.RedriveCount(m),
	}
}

// reason is an error's text as the ledger keeps it: the dead-letter rules
// (valid UTF-8, at most sdk.MaxReasonLength bytes), applied by annotating
// a scratch message, so both places keep the same text.
func reason(err error) string {
	var m sdk.Message
	sdk.AnnotateDeadLetter(&m, "q", 0, err, time.Time{}, time.Time{})
	return m.Header(sdk.HeaderDeadLetterReason)
}

// Publisher returns a publisher that publishes through p and records each
// message it published as enqueued, with its due time as NextAttemptAt
// when it is delayed (its Delay, or a later [sdk.HeaderDueAt]). Use it
// wherever jobs are published: with a broker, or as the outbox relay's
// publisher; inside or outside [sdk.LongDelay]. A batch that fails is
// recorded for the messages that [sdk.PublishError] says were published;
// the error is returned unchanged. When the buffer is full, a Publish waits
// for room at most Options.BlockTimeout in all, whatever the size of its
// batch, then drops (and counts) the events that still find it full.
//
// When p is an [sdk.AsyncPublisher] (RabbitMQ, JetStream, an
// [sdk.AsyncPool]), so is the returned publisher, and only then: the outbox
// relay and [sdk.NewAsyncPublisher] keep using the broker's own
// asynchronous publish through it. PublishAsync records a message when the
// broker confirms it, not when it fails, before the result it returns
// resolves; the event is recorded on the broker's confirming goroutine
// without waiting for room in the buffer (an event that finds the buffer
// full is dropped and counted, see Options.BlockTimeout), so that a slow
// ledger never holds up the broker's confirmations. p's other optional
// interfaces are reached through the returned publisher's
// Unwrap() sdk.Publisher method.
func (l *Ledger) Publisher(p sdk.Publisher) sdk.Publisher {
	pub := &publisher{l: l, p: p}
	if ap, ok := p.(sdk.AsyncPublisher); ok {
		return &asyncPublisher{publisher: pub, ap: ap}
	}
	return pub
}

type publisher struct {
	l *Ledger
	p sdk.Publisher
}

// Unwrap returns the wrapped publisher, for its optional interfaces.
func (p *publisher) Unwrap() sdk.Publisher { return p.p }

func (p *publisher) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	err := p.p.Publish(ctx, queue, msgs...)
	var failed map[string]error
	if err != nil {
		var pe *sdk.PublishError
		if !errors.As(err, &pe) {
			return err
		}
		failed = pe.Failed
	}
	now := time.Now()
	// One wait for the whole batch: with the buffer full, each message
	// waiting BlockTimeout of its own held the Publish up for as many.
	var by time.Time
	for _, m := range msgs {
		if m == nil || m.ID == "" {
			continue
		}
		if _, ok := failed[m.ID]; ok {
			continue
		}
		p.l.record(enqueued(m, queue, now), &by)
	}
	return err
}

// asyncPublisher is the publisher of a broker that publishes
// asynchronously: it keeps that capability visible (see Ledger.Publisher).
type asyncPublisher struct {
	*publisher
	ap sdk.AsyncPublisher
}

// PublishAsync publishes msg through the broker's PublishAsync and records
// it as enqueued once the broker confirms it; the result it returns
// resolves after that, with the broker's outcome.
func (p *asyncPublisher) PublishAsync(ctx context.Context, queue string, msg *sdk.Message) (*sdk.PublishResult, error) {
	res, err := p.ap.PublishAsync(ctx, queue, msg)
	if err != nil || res == nil {
		return res, err
	}
	out := sdk.NewPublishResult(res.ID())
	res.AfterResolve(func(err error) {
		// msg is the caller's until out resolves: reading it here is safe.
		if err == nil && msg.ID != "" {
			p.l.record(enqueued(msg, queue, time.Now()), nil)
		}
		out.Resolve(err)
	})
	return out, nil
}

// enqueued is the event of m published to queue at now.
func enqueued(m *sdk.Message, queue string, now time.Time) Event {
	e := base(m, queue)
	e.Status, e.At, e.NextAttemptAt = StatusEnqueued, now, dueAt(m, now)
	return e
}

// dueAt is when m, published at now, is due: after its Delay, or at its
// [sdk.HeaderDueAt] when that is later ([sdk.LongDelay] delivers the
// message at its Delay and hops until then; the job runs at the header's
// time). Zero when nothing delays it. The janitor keeps a row that never
// finished while its next attempt is due (see JanitorOptions.StaleRetention):
// without this a job delayed longer than StaleRetention lost its row.
func dueAt(m *sdk.Message, now time.Time) time.Time {
	var due time.Time
	if m.Delay > 0 {
		due = now.Add(m.Delay)
	}
	if v := m.Header(sdk.HeaderDueAt); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil && t.After(now) && t.After(due) {
			due = t
		}
	}
	return due
}

// DeadLetters returns dl with redrives by id recorded: the jobs it redrives
// show as redriven (a new generation at attempt 0) until they start again.
// A redrive of a whole queue (no ids) records nothing, nor does one that
// returns an error: which jobs it moved is not known (a job dead in the
// ledger may have had its dead letter purged, and must not show redriven,
// a state it would never leave); their next start shows the new
// generation.
func (l *Ledger) DeadLetters(dl sdk.DeadLetters) sdk.DeadLetters {
	return &deadLetters{l: l, DeadLetters: dl}
}

type deadLetters struct {
	l *Ledger
	sdk.DeadLetters
}

func (d *deadLetters) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	// Dated when the redrive begins, not when it returns: a job it moved
	// may run and die again before it returns (a redrive of many letters
	// moves them one by one), and the store redrives a dead row only if it
	// died no later than the redrive's time — dated after, its new death
	// would read as the one redriven, and the row show a generation that
	// never runs.
	now := time.Now()
	n, err := d.DeadLetters.RedriveDeadLetters(ctx, queue, ids...)
	if err != nil || len(ids) == 0 {
		// Which messages moved is not known (brokers may redrive part of a
		// batch; a whole-queue redrive names none, and a job dead in the
		// ledger may have been purged since): record nothing; their next
		// start shows the new generation.
		return n, err
	}
	for _, id := range ids {
		d.l.Record(Event{MessageID: id, Queue: queue, Status: StatusRedriven, At: now})
	}
	return n, err
}

// SyncDeadLetters records as dead the dead letters of queue that dl lists
// (at most limit, [sdk.DefaultListLimit] when limit <= 0; brokers list the
// oldest first), with the reason, class and attempt the broker wrote on
// them. It catches what no Worker sees: a message the broker itself
// dead-lettered (the poison cap, [sdk.ErrMaxDeliveries]: a job that kept
// crashing or losing its lease; a broker's own policy such as a TTL), whose
// row would otherwise stay running or retrying. A job the Worker
// dead-lettered is already dead at that attempt and does not change (the
// guard keeps the first final state of an attempt). A dead letter that
// does not carry its attempt (RabbitMQ's, when the queue kept no delivery
// count) ends whatever attempt the row is at. A letter's failure time
// (berth-last-failure) in the future is taken as now; its reason and class
// are kept as valid UTF-8 of at most [sdk.MaxReasonLength] bytes, like the
// Worker's own. Listing is read-only on every broker; it returns how many
// events it recorded.
//
// Run it periodically (the [Janitor] does, for its DeadLetterQueues) or
// after an incident.
func (l *Ledger) SyncDeadLetters(ctx context.Context, dl sdk.DeadLetters, queue string, limit int) (int, error) {
	return l.syncDeadLetters(ctx, dl, queue, limit, time.Time{})
}

// syncDeadLetters is SyncDeadLetters recording the letters that died before
// purged (the janitor's retention cutoff) as of unknown attempt, an event
// that ends a row's attempt but never makes a row: their job, finished
// before the retention, is or will be purged, and must not come back at
// every sync for as long as the letter stays in its queue.
func (l *Ledger) syncDeadLetters(ctx context.Context, dl sdk.DeadLetters, queue string, limit int, purged time.Time) (int, error) {
	msgs, err := dl.ListDeadLetters(ctx, queue, limit)
	if err != nil {
		return 0, fmt.Errorf("ledger: sync dead letters of %s: %w", queue, err)
	}
	return l.recordDeadLetters(msgs, queue, purged), nil
}

// recordDeadLetters records msgs, dead letters of queue, as syncDeadLetters
// does, and returns how many events it recorded.
func (l *Ledger) recordDeadLetters(msgs []*sdk.Message, queue string, purged time.Time) int {
	n := 0
	for _, m := range msgs {
		if m == nil || m.ID == "" {
			continue
		}
		q := m.Header(sdk.HeaderDeadLetterQueue)
		if q == "" {
			q = queue
		}
		e := base(m, q)
		// The reason and class are headers, which a letter the broker
		// dead-lettered itself keeps from its producer: made valid UTF-8
		// and cut to sdk.MaxReasonLength, rune-safe, as the Worker's own
		// reasons are (see reason).
		e.Status, e.Error = StatusDead, sdk.SanitizeReason(m.Header(sdk.HeaderDeadLetterReason))
		e.Class = sdk.ErrorClass(sdk.SanitizeReason(m.Header(sdk.HeaderDeadLetterClass)))
		e.Attempt, _ = strconv.Atoi(m.Header(sdk.HeaderDeadLetterAttempts))
		e.Attempt = max(e.Attempt, 0)
		e.At = time.Now()
		// The failure time is a header, which a letter the broker
		// dead-lettered itself keeps from its producer: one in the future
		// would keep the row from its retention and its redrive.
		if t, err := time.Parse(time.RFC3339Nano, m.Header(sdk.HeaderLastFailure)); err == nil && t.Before(e.At) {
			e.At = t
		}
		if e.At.Before(purged) {
			e.Attempt = 0
		}
		l.Record(e)
		n++
	}
	return n
}
