package ledger

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/berthq/berth/sdk"
)

// Start records that d's attempt started (status running). It is the
// [sdk.Observer] half the Worker calls before the handler; it returns ctx
// unchanged.
func (l *Ledger) Start(ctx context.Context, d sdk.Delivery) context.Context {
	m := d.Message()
	now := time.Now()
	e := base(m, d.Queue())
	e.Status, e.Attempt, e.At, e.StartedAt, e.Worker = StatusRunning, d.Attempt(), now, now, l.worker
	l.Record(e)
	return ctx
}

// Settled records how d's attempt ended: succeeded (ack), retrying with its
// next attempt time (retry), dead (dead letter), released (handed back). A
// settlement whose call failed is not recorded (the delivery comes back and
// its next attempt is), and neither is a lost lease: the row stays running
// until another consumer's attempt replaces it.
func (l *Ledger) Settled(_ context.Context, d sdk.Delivery, s sdk.Settlement) {
	if s.Err != nil {
		return
	}
	m := d.Message()
	now := time.Now()
	e := base(m, d.Queue())
	e.Attempt, e.At, e.Worker, e.Duration = d.Attempt(), now, l.worker, s.Duration
	if s.Duration > 0 {
		e.StartedAt = now.Add(-s.Duration)
	}
	if s.Cause != nil {
		e.Error, e.Class = reason(s.Cause), s.Class
	}
	switch s.Action {
	case sdk.ActionAck:
		e.Status = StatusSucceeded
	case sdk.ActionRetry:
		e.Status, e.NextAttemptAt = StatusRetrying, now.Add(s.Delay)
	case sdk.ActionDeadLetter:
		e.Status = StatusDead
	case sdk.ActionRelease:
		e.Status, e.NextAttemptAt = StatusReleased, now.Add(s.Delay)
	default:
		return
	}
	l.Record(e)
}

// base is the part of an event every feed knows from the message.
func base(m *sdk.Message, queue string) Event {
	gen, _ := strconv.Atoi(m.Header(sdk.HeaderRedriveCount))
	return Event{
		MessageID: m.ID, Queue: queue, Type: m.Type, IdempotencyKey: m.IdempotencyKey,
		CorrelationID: m.CorrelationID, Generation: max(gen, 0),
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
// message it published as enqueued. Use it wherever jobs are published:
// with a broker, or as the outbox relay's publisher. A batch that fails is
// recorded for the messages that [sdk.PublishError] says were published;
// the error is returned unchanged.
func (l *Ledger) Publisher(p sdk.Publisher) sdk.Publisher { return &publisher{l: l, p: p} }

type publisher struct {
	l *Ledger
	p sdk.Publisher
}

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
	for _, m := range msgs {
		if m == nil || m.ID == "" {
			continue
		}
		if _, ok := failed[m.ID]; ok {
			continue
		}
		e := base(m, queue)
		e.Status, e.At = StatusEnqueued, now
		p.l.Record(e)
	}
	return err
}

// DeadLetters returns dl with redrives recorded: the jobs it redrives show
// as redriven (a new generation at attempt 0) until they start again. A
// redrive of a whole queue (no ids) marks every job of the queue that was
// dead in the ledger when the redrive began. A redrive that returns an
// error records nothing.
func (l *Ledger) DeadLetters(dl sdk.DeadLetters) sdk.DeadLetters {
	return &deadLetters{l: l, DeadLetters: dl}
}

type deadLetters struct {
	l *Ledger
	sdk.DeadLetters
}

func (d *deadLetters) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	began := time.Now()
	n, err := d.DeadLetters.RedriveDeadLetters(ctx, queue, ids...)
	if err != nil {
		// Which messages moved is not known (brokers may redrive part of a
		// batch): record nothing; their next start shows the new generation.
		return n, err
	}
	if len(ids) == 0 {
		d.l.Record(Event{Queue: queue, Status: StatusRedriven, At: began, RedriveAll: true})
		return n, err
	}
	now := time.Now()
	for _, id := range ids {
		d.l.Record(Event{MessageID: id, Queue: queue, Status: StatusRedriven, At: now})
	}
	return n, err
}
