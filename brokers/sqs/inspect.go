package sqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/sdk"
)

// Dead-letter scans (list, get, redrive, purge) receive the dead letters they
// look at, which hides them from other receivers until the scan makes them
// visible again or deletes them.
const (
	// defaultHold is how long a scan hides a dead letter it holds; the scan
	// extends it every third of that while it holds the letter.
	defaultHold = 30 * time.Second
	// lostHold is how long a scan's receive hides the dead letters it takes,
	// before the scan extends their hold to the full one. A receive whose
	// answer was lost (the SDK retried an attempt that may have reached
	// SQS, see lostAttempt) hides letters nobody holds for that long, so a
	// scan that lost an answer does not end before lostHold has passed: it
	// sees them again instead of missing them.
	lostHold = 5 * time.Second
	// defaultMaxHeld bounds how many dead letters one scan holds at once:
	// those it looked at and must keep hidden to see further (not the one
	// Get or Redrive looks for, or one a redrive could not send). A scan
	// that reaches it stops with a [*ScanError].
	defaultMaxHeld = 10000
	// scanWait is the long-poll wait of a scan's receives.
	scanWait = time.Second
	// emptyReceives consecutive empty receives end a scan. A long poll
	// (WaitTimeSeconds > 0) asks every SQS server, so one empty answer means
	// no dead letter was visible. The approximate counters do not end a
	// scan: they lag, and do not count messages whose hold has just lapsed.
	emptyReceives = 1
	// defaultListLimit is ListDeadLetters' limit when none is given.
	defaultListLimit = 100
)

// Stats reports queue's approximate counters (GetQueueAttributes):
// ApproximateNumberOfMessages (Ready), ...Delayed (Delayed),
// ...NotVisible (InFlight: received and not settled, and also messages
// waiting out a Retry delay), and the dead-letter queue's total
// (DeadLettered). SQS reports no oldest-message age there: OldestAge is 0.
// It implements [sdk.Inspector].
func (b *Broker) Stats(ctx context.Context, queue string) (sdk.QueueStats, error) {
	st := sdk.QueueStats{Queue: queue}
	if b.closed.Load() {
		return st, sdk.ErrClosed
	}
	ctx, done := b.watch(ctx)
	defer done()
	q, err := b.queue(ctx, queue)
	if err != nil {
		return st, err
	}
	c, err := b.counts(ctx, q)
	if err != nil {
		return st, err
	}
	st.Ready, st.InFlight, st.Delayed = c[0], c[1], c[2]
	dlq, err := b.deadLetterQueue(ctx, q)
	if errors.Is(err, sdk.ErrNotFound) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if c, err = b.counts(ctx, dlq); err != nil {
		return st, err
	}
	st.DeadLettered = c[0] + c[1] + c[2]
	return st, nil
}

// counts returns q's visible, not visible and delayed message counts.
func (b *Broker) counts(ctx context.Context, q *queueRef) ([3]int64, error) {
	var c [3]int64
	names := []sqstypes.QueueAttributeName{
		sqstypes.QueueAttributeNameApproximateNumberOfMessages,
		sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		sqstypes.QueueAttributeNameApproximateNumberOfMessagesDelayed,
	}
	out, err := b.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(q.url), AttributeNames: names}, withBody)
	if err != nil {
		return c, b.wrap(ctx, "read counters of "+q.name, err)
	}
	for i, n := range names {
		c[i], _ = strconv.ParseInt(out.Attributes[string(n)], 10, 64)
	}
	return c, nil
}

// ErrScanIncomplete is wrapped by a [*ScanError].
var ErrScanIncomplete = errors.New("berth/sqs: dead-letter scan incomplete")

// ScanError reports a dead-letter call that ended with dead letters it was
// asked to reach still in the dead-letter queue, for a reason other than a
// failed call (which is returned as it is). It wraps [ErrScanIncomplete].
type ScanError struct {
	Queue string // the queue whose dead letters were scanned
	// Remaining is how many dead letters the call knows remain (those it
	// held and made visible again); more may.
	Remaining int
	Reason    string
}

// Error says what remains and why.
func (e *ScanError) Error() string {
	return fmt.Sprintf("berth/sqs: dead letters of %s: %d or more remain: %s", e.Queue, e.Remaining, e.Reason)
}

// Unwrap returns [ErrScanIncomplete].
func (e *ScanError) Unwrap() error { return ErrScanIncomplete }

// letter is a dead letter a scan received and holds invisible.
type letter struct {
	sqsID  string
	group  string       // the FIFO message group it was received with (see receivedGroup)
	handle string       // the receipt that holds it; "" once its hold was lost
	msg    *sdk.Message // nil once the scan no longer needs it
	// sent is SQS's SentTimestamp: when the letter was sent to the
	// dead-letter queue (berth's dead letters), or, moved there by SQS's
	// redrive policy from a standard queue, to its source queue; zero when
	// SQS did not say.
	sent time.Time
}

// scan walks a dead-letter queue: each call of next receives the letters it
// has not seen yet, and holds them (extending their visibility) until the
// scan deletes or releases them.
type scan struct {
	b       *Broker
	q, dlq  *queueRef
	held    map[string]*letter // by SQS MessageId
	renewed time.Time
	empties int
	// lostUntil is when letters that a lost receive answer took are
	// visible again: an empty receive before then does not end the scan.
	lostUntil time.Time
	// whole makes the scan, when receives find nothing, read the
	// dead-letter queue's counters (see elsewhere): a scan that must see
	// every letter (a redrive or purge of all, a Get or a Delete that has
	// not found its IDs) goes on while other readers hold letters, for up
	// to a hold, and unseen says how many it could not see by then.
	whole       bool
	unseenSince time.Time // when an end found letters held elsewhere, since the scan last found any
	unseen      int
	// blocked is how many of unseen are letters of a FIFO dead-letter
	// queue queued behind letters this scan holds (mine of them) in their
	// message groups: SQS returns no more letters of a group while earlier
	// ones are held, so no wait shows them.
	blocked, mine int
	// waited is how long the scan waited, at its end, for letters held
	// elsewhere to be visible again (0: it did not wait).
	waited time.Duration
}

// next returns dead letters the scan has not returned before, holding them,
// or none once emptyReceives receives in a row found nothing (and, for a
// whole scan, no letter is held elsewhere, or a hold has passed since the
// scan found letters held elsewhere and nothing new: see whole).
func (s *scan) next(ctx context.Context) ([]*letter, error) {
	for {
		// unseen counts what the scan could not see at its end: one it
		// goes on past (it found letters after all) counts nothing.
		s.unseen, s.blocked, s.waited = 0, 0, 0
		ls, err := s.receive(ctx)
		if len(ls) > 0 {
			// The wait for letters held elsewhere starts again from the
			// next end: a wait at an early end (a listing held some
			// letters for a moment) must not leave none for the last.
			s.unseenSince = time.Time{}
		}
		if err != nil || len(ls) > 0 || !s.whole {
			return ls, err
		}
		n, blocked, err := s.elsewhere(ctx)
		if err != nil {
			return nil, err
		}
		s.unseen, s.blocked = n+blocked, blocked
		if !s.unseenSince.IsZero() {
			s.waited = time.Since(s.unseenSince)
		}
		if n == 0 {
			// Nothing is held elsewhere: the letters the scan cannot see
			// (if any) are behind its own, which no wait releases.
			return nil, nil
		}
		if s.unseenSince.IsZero() {
			s.unseenSince = time.Now()
		}
		if s.waited >= s.b.scanHold {
			return nil, nil
		}
		s.empties = 0 // scan on: the receive's long poll paces this
	}
}

// elsewhere returns how many letters of the dead-letter queue the scan
// does not hold, by its approximate counters: letters another reader holds
// invisible (a listing, another redrive, a receive whose answer was lost),
// delayed ones, and visible ones a receive has not returned yet. A receive
// cannot see the letters held elsewhere, so an end of the scan found by
// receives alone would pass over them without saying so.
//
// On a FIFO dead-letter queue the letters the scan holds lock their message
// groups: SQS returns no more letters of a group while earlier ones are in
// flight, so visible letters behind them are not returned however long the
// scan waits. When the scan holds letters and nothing else is in flight or
// delayed, every visible letter it did not see is one of those (its group
// is locked, and only by the scan): they are returned as blocked, not as
// held elsewhere, so that the scan ends at once and says why.
func (s *scan) elsewhere(ctx context.Context) (held, blocked int, err error) {
	c, err := s.b.counts(ctx, s.dlq)
	if err != nil {
		return 0, 0, err
	}
	mine := 0
	for _, l := range s.held {
		if l.handle != "" {
			mine++
		}
	}
	s.mine = mine
	if s.dlq.fifo && mine > 0 && c[1] <= int64(mine) && c[2] == 0 {
		return 0, int(c[0]), nil
	}
	return max(int(c[0]+c[1]+c[2])-mine, 0), 0, nil
}

// unseenError is the error of a whole scan that ended with s.unseen
// letters it could not see, nil when it saw them all.
func (s *scan) unseenError() *ScanError {
	if s.unseen == 0 {
		return nil
	}
	return &ScanError{Queue: s.q.name, Remaining: s.unseen, Reason: s.unseenReason()}
}

// unseenReason says why the scan could not see s.unseen letters, and how
// long it waited for them: the whole hold, less when the letters it could
// not see were behind its own in FIFO groups (which no wait releases).
func (s *scan) unseenReason() string {
	waited := "it did not wait for them"
	if s.waited > 0 {
		waited = fmt.Sprintf("it waited %s for them (up to %s)", s.waited.Round(100*time.Millisecond), s.b.scanHold)
	}
	if s.blocked > 0 {
		return fmt.Sprintf("%d dead letters (by the queue's approximate counters) are queued in FIFO message groups behind "+
			"letters this scan held (%d): SQS returns no more letters of a group while earlier ones are in flight, so the scan "+
			"could not reach them, and %s; redrive or delete the letters ahead of them first (a redrive or purge of all reaches them)",
			s.unseen, s.mine, waited)
	}
	fifo := ""
	if s.dlq.fifo && s.mine > 0 {
		fifo = fmt.Sprintf(" (some may be queued in FIFO message groups behind letters this scan held (%d))", s.mine)
	}
	return fmt.Sprintf("%d dead letters (by the queue's approximate counters) were held invisible by another reader "+
		"(a listing, another redrive) or not yet visible%s, and the scan could not see them: %s; "+
		"run it again once they are visible", s.unseen, fifo, waited)
}

// receive is next without the whole scan's look at the counters.
func (s *scan) receive(ctx context.Context) ([]*letter, error) {
	for s.empties < emptyReceives {
		if err := s.renew(ctx); err != nil {
			return nil, err
		}
		first := min(lostHold, s.b.scanHold)
		msgs, _, lost, err := s.b.receive(ctx, s.dlq, batchSize, first, scanWait)
		if lost != nil {
			s.lostUntil = time.Now().Add(first)
		}
		if err != nil {
			return nil, err
		}
		if len(msgs) == 0 {
			if time.Now().Before(s.lostUntil) {
				continue // the long poll paces this
			}
			s.empties++
			continue
		}
		s.empties = 0
		var out, taken []*letter
		for _, m := range msgs {
			id := aws.ToString(m.MessageId)
			if l := s.held[id]; l != nil {
				// Its hold lapsed and this receive took it again: the new
				// receipt is the one that holds it now.
				l.handle = aws.ToString(m.ReceiptHandle)
				taken = append(taken, l)
				continue
			}
			l := &letter{sqsID: id, group: receivedGroup(m), handle: aws.ToString(m.ReceiptHandle), msg: s.b.message(s.dlq, m), sent: sentAt(m)}
			s.b.annotate(ctx, s.q, s.dlq, l.msg, m)
			s.held[id] = l
			out = append(out, l)
			taken = append(taken, l)
		}
		if first < s.b.scanHold {
			if err := s.b.changeVisibilityBatch(ctx, s.dlq, taken, s.b.scanHold); err != nil {
				return nil, err
			}
		}
		if len(out) > 0 {
			return out, nil
		}
	}
	return nil, nil
}

// sentAt is m's SentTimestamp (Unix milliseconds), zero when it has none.
func sentAt(m sqstypes.Message) time.Time {
	return msAttr(m, sqstypes.MessageSystemAttributeNameSentTimestamp)
}

// msAttr is m's system attribute name, a time in Unix milliseconds, zero
// when it has none.
func msAttr(m sqstypes.Message, name sqstypes.MessageSystemAttributeName) time.Time {
	ms, err := strconv.ParseInt(m.Attributes[string(name)], 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// recentIDs is the set of the last max IDs added (at least 1): a
// redrive of all remembers the berth IDs it redrove in memory bounded as
// its scan's held letters are, not by how many it redrives.
type recentIDs struct {
	max    int
	ids    map[string]struct{}
	ring   []string // in the order added; once full, next is the oldest
	next   int
	forgot bool // an ID was dropped to make room
}

func newRecentIDs(n int) *recentIDs {
	return &recentIDs{max: max(n, 1), ids: map[string]struct{}{}}
}

// has reports whether id is one of the last r.max IDs added.
func (r *recentIDs) has(id string) bool {
	_, ok := r.ids[id]
	return ok
}

// add adds id, dropping the oldest ID when r holds r.max already.
func (r *recentIDs) add(id string) {
	if r.has(id) {
		return
	}
	if len(r.ring) < r.max {
		r.ring = append(r.ring, id)
	} else {
		delete(r.ids, r.ring[r.next])
		r.ring[r.next] = id
		r.next = (r.next + 1) % r.max
		r.forgot = true
	}
	r.ids[id] = struct{}{}
}

// redriveMemo, when set (by tests), is called at the end of every
// RedriveDeadLetters with how many IDs the call remembered then.
var redriveMemo atomic.Pointer[func(remembered int)]

// full reports whether the scan holds as many letters as it may.
func (s *scan) full() bool { return len(s.held) >= s.b.scanMax }

// incomplete is the error of a scan that stopped because it was full.
func (s *scan) incomplete() error {
	return &ScanError{Queue: s.q.name, Remaining: len(s.held),
		Reason: fmt.Sprintf("the scan stopped after holding %d dead letters", s.b.scanMax)}
}

// renew extends the hold of every letter the scan holds, once a third of the
// hold has passed since the last renewal, so that no receipt goes stale
// however long the scan takes. A letter whose receipt no longer holds it
// loses its handle until a receive takes it again.
func (s *scan) renew(ctx context.Context) error {
	if time.Since(s.renewed) < s.b.scanHold/3 {
		return nil
	}
	s.renewed = time.Now()
	ls := make([]*letter, 0, len(s.held))
	for _, l := range s.held {
		if l.handle != "" {
			ls = append(ls, l)
		}
	}
	return s.b.changeVisibilityBatch(ctx, s.dlq, ls, s.b.scanHold)
}

// forget drops letters the scan deleted.
func (s *scan) forget(ls []*letter) {
	for _, l := range ls {
		delete(s.held, l.sqsID)
	}
}

// annotate makes msg, received from q's dead-letter queue dlq, say why it is
// there. A dead letter berth made carries the reason headers and names its
// source queue, one whose dead-letter queue dlq is. Any other message — moved
// by SQS's redrive policy after maxReceiveCount receives, or sent there by
// another producer, whose berth- headers may be forged — loses the
// dead-letter headers it carries and gets those of a poison message: reason
// [sdk.ErrMaxDeliveries], attempts the policy's maxReceiveCount, source
// queue q, and failure times from what SQS says of the message (see
// [policyFailure]).
//
// A dead letter whose annotations DeadLetter shortened to fit
// ([HeaderDeadLetterTruncated]) is berth's too: with its reason cut or left
// out it still names its source queue, which must feed dlq; with every
// annotation left out ("all") it names none, and is listed as it was sent,
// without a reason.
func (b *Broker) annotate(ctx context.Context, q, dlq *queueRef, msg *sdk.Message, raw sqstypes.Message) {
	truncated := msg.Header(HeaderDeadLetterTruncated)
	source := msg.Header(sdk.HeaderDeadLetterQueue)
	switch {
	case (msg.Header(sdk.HeaderDeadLetterReason) != "" || truncated == "reason") && b.feeds(ctx, q, source, dlq):
		return
	case truncated == "all" && !hasDeadLetterNote(msg):
		// fitDeadLetter's "all" leaves out every annotation: one that
		// carries any (a forged envelope's) is not berth's.
		return
	}
	for _, h := range []string{sdk.HeaderDeadLetterReason, sdk.HeaderDeadLetterClass, sdk.HeaderDeadLetterAttempts,
		sdk.HeaderDeadLetterQueue, sdk.HeaderFirstFailure, sdk.HeaderLastFailure, sdk.HeaderAttempt, HeaderDeadLetterTruncated} {
		delete(msg.Headers, h)
	}
	attempts := int(q.maxReceive.Load())
	if attempts <= 0 {
		attempts = max(receiveCount(raw)-1, 1)
	}
	first, last := policyFailure(raw, time.Now())
	sdk.AnnotateDeadLetter(msg, q.name, attempts, sdk.ErrMaxDeliveries, first, last)
}

// policyFailure returns the failure times annotate gives m, a dead letter
// berth did not send: moved by SQS's redrive policy, or sent to the
// dead-letter queue by another producer. SQS does not say when it moved a
// message, and the listing's own time (now) would change at every listing:
// an age filter (`berth dlq -older-than`) would never match the letter,
// and whatever records dead letters from listings (the ledger) would see a
// new failure each time. So both are times the message carries, by SQS's
// clock (milliseconds), the same at every listing. The last failure is the
// later of its ApproximateFirstReceiveTimestamp (its first receive: the
// policy moves a message only after its last receive's visibility timeout,
// so the move came later; SQS keeps the attribute when it moves a message,
// as fauxqs does) and its SentTimestamp (on a standard queue the original
// send, which the move keeps; a FIFO queue's move may reset it to the
// move's time). The first failure is the first receive. One of the two
// serves for both when the other is missing; a message carrying neither
// gets now. For another producer's message the first receive may be the
// first listing's.
func policyFailure(m sqstypes.Message, now time.Time) (first, last time.Time) {
	received := msAttr(m, sqstypes.MessageSystemAttributeNameApproximateFirstReceiveTimestamp)
	last = sentAt(m)
	if received.After(last) {
		last = received
	}
	if last.IsZero() {
		return now, now
	}
	if received.IsZero() {
		return last, last
	}
	return received, last
}

// hasDeadLetterNote reports whether msg carries any of the annotations
// that fitDeadLetter leaves out with "all".
func hasDeadLetterNote(msg *sdk.Message) bool {
	for _, h := range deadLetterNotes {
		if _, ok := msg.Headers[h]; ok {
			return true
		}
	}
	return false
}

// feeds reports whether queue name's dead letters go to dlq: it is q (whose
// dead-letter queue dlq is), or a queue whose redrive policy names dlq.
func (b *Broker) feeds(ctx context.Context, q *queueRef, name string, dlq *queueRef) bool {
	if name == q.name {
		return true
	}
	if validateQueueName(name) != nil {
		return false
	}
	src, err := b.queue(ctx, name)
	if err != nil {
		return false
	}
	d, err := b.deadLetterQueue(ctx, src)
	return err == nil && d.url == dlq.url
}

// changeVisibilityBatch sets the visibility of the letters to d, or longer
// while a poll of dlq this Broker gave up on may still wait on the server
// (see polls). A letter whose receipt no longer holds it loses its handle;
// other failures are returned.
func (b *Broker) changeVisibilityBatch(ctx context.Context, dlq *queueRef, ls []*letter, d time.Duration) error {
	// A letter released while a scan's poll this Broker gave up on may
	// still wait on the server would be taken by it (see polls).
	d = max(d, dlq.polls.hold(time.Now()))
	var errs []error
	for start := 0; start < len(ls); start += batchSize {
		chunk := ls[start:min(start+batchSize, len(ls))]
		in := &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(dlq.url)}
		for i, l := range chunk {
			in.Entries = append(in.Entries, sqstypes.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(l.handle), VisibilityTimeout: ceilSeconds(d),
			})
		}
		out, err := b.client.ChangeMessageVisibilityBatch(ctx, in, withBody)
		if err != nil {
			errs = append(errs, b.wrap(ctx, "change the visibility of dead letters of "+dlq.name, err))
			continue
		}
		for _, f := range out.Failed {
			i, err := strconv.Atoi(aws.ToString(f.Id))
			if err == nil && i >= 0 && i < len(chunk) && staleCode(aws.ToString(f.Code)) {
				chunk[i].handle = ""
				continue
			}
			errs = append(errs, fmt.Errorf("berth/sqs: change the visibility of a dead letter of %s: %w", dlq.name,
				&EntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}))
		}
	}
	return errors.Join(errs...)
}

// remove deletes the letters now and returns those deleted.
func (b *Broker) remove(ctx context.Context, dlq *queueRef, ls []*letter) ([]*letter, error) {
	var errs []error
	var gone []*letter
	for start := 0; start < len(ls); start += batchSize {
		chunk := ls[start:min(start+batchSize, len(ls))]
		in := &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(dlq.url)}
		for i, l := range chunk {
			in.Entries = append(in.Entries, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(l.handle)})
		}
		out, err := b.client.DeleteMessageBatch(ctx, in, withBody)
		if err != nil {
			errs = append(errs, b.wrap(ctx, "delete dead letters of "+dlq.name, err))
			continue
		}
		answered := make([]bool, len(chunk))
		for _, r := range out.Successful {
			if i, err := strconv.Atoi(aws.ToString(r.Id)); err == nil && i >= 0 && i < len(chunk) && !answered[i] {
				answered[i] = true
				gone = append(gone, chunk[i])
			}
		}
		for _, f := range out.Failed {
			if i, err := strconv.Atoi(aws.ToString(f.Id)); err == nil && i >= 0 && i < len(chunk) {
				answered[i] = true
			}
			errs = append(errs, fmt.Errorf("berth/sqs: delete a dead letter of %s: %w", dlq.name,
				&EntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}))
		}
		for i, ok := range answered {
			if !ok { // in neither list: never silently assume either outcome
				errs = append(errs, fmt.Errorf("berth/sqs: delete dead letter %s of %s: SQS reported neither success nor failure: %w",
					chunk[i].sqsID, dlq.name, sdk.ErrUnavailable))
			}
		}
	}
	return gone, errors.Join(errs...)
}

// ListDeadLetters returns up to limit (default 100) messages of queue's
// dead-letter queue, with their reason headers. It receives them, holding
// them invisible while it scans, then makes them visible again: concurrent
// scans of the same queue see fewer messages. It implements
// [sdk.DeadLetters].
func (b *Broker) ListDeadLetters(ctx context.Context, queue string, limit int) ([]*sdk.Message, error) {
	var out []*sdk.Message
	err := b.StreamDeadLetters(ctx, queue, limit, func(page []*sdk.Message) error {
		out = append(out, page...)
		return nil
	})
	return out, err
}

// StreamDeadLetters is [Broker.ListDeadLetters] that hands the dead letters
// to fn as it receives them, a page (at most 10) at a time, instead of
// returning them all: what it keeps of the letters' text is one page, not
// up to limit letters. As ListDeadLetters, it holds every letter it has read
// invisible until it ends (so that its receives see further, and no letter
// is read twice), then makes them visible again: fn must not keep the page,
// and must not look the letters up or change them through a broker (they
// are held); it is called on the caller's goroutine, and an error it returns
// ends the scan and is returned.
func (b *Broker) StreamDeadLetters(ctx context.Context, queue string, limit int, fn func(page []*sdk.Message) error) error {
	if limit <= 0 {
		limit = defaultListLimit
	}
	read := 0
	return b.withScan(ctx, queue, func(ctx context.Context, s *scan) error {
		for read < limit {
			ls, err := s.next(ctx)
			if err != nil || len(ls) == 0 {
				return err
			}
			page := make([]*sdk.Message, 0, len(ls))
			for _, l := range ls {
				if read < limit {
					page = append(page, l.msg)
					read++
				}
				l.msg = nil // held, not needed: only its receipt stays
			}
			if err := fn(page); err != nil {
				return err
			}
		}
		return nil
	})
}

// GetDeadLetter returns the dead letter with berth ID (or SQS MessageId) id,
// or an error wrapping [sdk.ErrNotFound] once a scan of the whole dead-letter
// queue did not find it. A scan that has to hold more than 10,000 other dead
// letters stops with a [*ScanError] instead, as does one that ends with
// dead letters held invisible by another reader (it may be one of them), or,
// on a FIFO dead-letter queue, with letters queued in their message groups
// behind those the scan holds (see [Broker.RedriveDeadLetters]).
func (b *Broker) GetDeadLetter(ctx context.Context, queue, id string) (*sdk.Message, error) {
	var found *sdk.Message
	var unseen *ScanError
	err := b.withScan(ctx, queue, func(ctx context.Context, s *scan) error {
		s.whole = true
		defer func() { unseen = s.unseenError() }()
		for found == nil {
			if s.full() {
				return s.incomplete()
			}
			ls, err := s.next(ctx)
			if err != nil || len(ls) == 0 {
				return err
			}
			for _, l := range ls {
				if found == nil && (l.msg.ID == id || l.sqsID == id) {
					found = l.msg
				}
				l.msg = nil
			}
		}
		return nil
	})
	if found != nil {
		return found, err
	}
	if err != nil {
		return nil, err
	}
	if unseen != nil {
		return nil, unseen // it may be one of those
	}
	return nil, fmt.Errorf("berth/sqs: dead letter %s of %s: %w", sdk.ErrorText(id), queue, sdk.ErrNotFound)
}

// RedriveDeadLetters sends the dead letters with the given IDs (berth IDs or
// SQS MessageIds; all of them when none is given) back to queue, as new
// messages (so their receive count, Attempt(), starts again) with the reason
// headers removed and [sdk.HeaderRedriveCount] incremented, and deletes them
// from the dead-letter queue. The target is always queue, whose dead-letter
// queue is being read, never a header's value. On a FIFO queue each keeps
// the message group it has in the dead-letter queue (the group it was
// published to), not this Broker's [Options.DefaultGroup].
//
// It pages through the dead-letter queue, redriving each page as it goes,
// until receives find it empty. It returns how many it redrove, and an error
// wrapping [sdk.ErrNotFound] naming the IDs it did not find. Dead letters it
// could not send stay, with the errors returned. So does one whose copy was
// sent while another reader took it (the send outlasted the scan's hold):
// it is not counted, and its error wraps [sdk.ErrLeaseLost]. With no IDs, a
// dead letter whose berth ID the call already redrove (it came back, dead-lettered again
// by a consumer while the redrive ran, or it is a duplicate) stays too, so
// that the call ends. It remembers only the last 10,000 IDs it redrove
// (bounded memory, however many it redrives): once it has redriven more, a
// dead letter whose SentTimestamp (SQS's clock, against the caller's) is
// not before the call began stays as well, as one it redrove that came
// back would (one back within the clocks' skew of the start may be
// redriven once more), and a duplicate of a letter redriven more than
// 10,000 letters earlier is redriven too. Those that stay are reported by
// a [*ScanError], as is a scan that had to hold more than 10,000 dead
// letters, and dead letters another reader held invisible until the call
// gave up waiting for them (a hold, 30 s; see the package doc): the error counts them, and they stay. On a FIFO
// dead-letter queue a redrive by IDs cannot reach a letter queued in its
// message group behind letters the scan holds (the first of the group, at
// most 10 in one receive, or ones it could not send): SQS returns no more of a group while earlier
// letters are in flight, so when nothing else holds letters the call ends
// at once with a [*ScanError] saying so, without waiting. A ctx that ends
// stops the call between pages: a page whose copies went out is finished
// (its letters deleted from the dead-letter queue) and counted first.
func (b *Broker) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	return b.redriveDeadLetters(ctx, queue, nil, ids...)
}

// RedriveDeadLettersProgress is [Broker.RedriveDeadLetters] of every dead
// letter (no IDs) that calls progress, when not nil, with the running count
// of letters redriven after each page that redrove some: a redrive of a
// large dead-letter queue moves at most 10 letters a receive, and takes
// minutes. It moves exactly what RedriveDeadLetters does, and returns the
// same count and error; progress is called on the caller's goroutine.
func (b *Broker) RedriveDeadLettersProgress(ctx context.Context, queue string, progress func(done int)) (int, error) {
	return b.redriveDeadLetters(ctx, queue, progress)
}

// redriveDeadLetters is RedriveDeadLetters, calling progress (when not nil)
// as RedriveDeadLettersProgress says.
func (b *Broker) redriveDeadLetters(ctx context.Context, queue string, progress func(done int), ids ...string) (int, error) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	found := map[string]bool{}
	left := len(want)
	began := time.Now()
	sent := newRecentIDs(b.scanMax) // the last berth IDs redriven by this call
	if memo := redriveMemo.Load(); memo != nil {
		defer func() { (*memo)(len(sent.ids)) }()
	}
	again := 0
	redriven := 0
	var errs []error
	var unseen *ScanError
	err := b.withScan(ctx, queue, func(ctx context.Context, s *scan) error {
		s.whole = true
		defer func() { unseen = s.unseenError() }()
		for len(want) == 0 || left > 0 {
			if s.full() {
				return s.incomplete()
			}
			ls, err := s.next(ctx)
			if err != nil || len(ls) == 0 {
				return err
			}
			var page []*letter
			inPage := map[string]bool{}
			for _, l := range ls {
				switch {
				case len(want) > 0 && !want[l.msg.ID] && !want[l.sqsID]:
				case len(want) == 0 && (sent.has(l.msg.ID) || inPage[l.msg.ID] || sent.forgot && !l.sent.Before(began)):
					// Redriven by this call already (or a duplicate), or,
					// once the call no longer remembers every ID it
					// redrove, sent to the dead-letter queue since the call
					// began: one it redrove that came back must not be
					// redriven again, or the call might never end.
					again++
				default:
					for _, k := range []string{l.msg.ID, l.sqsID} {
						if want[k] && !found[k] {
							found[k] = true
							left--
						}
					}
					page = append(page, l)
					inPage[l.msg.ID] = true
					continue
				}
				l.msg = nil // held, not needed
			}
			n, err := b.redrive(ctx, s, page, sent)
			redriven += n
			if err != nil {
				errs = append(errs, err)
			}
			if progress != nil && n > 0 {
				progress(redriven)
			}
		}
		return nil
	})
	if err == nil && again > 0 {
		se := &ScanError{Queue: queue, Remaining: again,
			Reason: "this call already redrove a message with the same ID (dead-lettered again while the redrive ran, or a duplicate)"}
		if sent.forgot {
			se.Reason += ", or the dead letter was sent to the dead-letter queue after the call began (the call redrove more letters than it remembers)"
		}
		if unseen != nil {
			se.Remaining += unseen.Remaining
			se.Reason += "; and " + unseen.Reason
		}
		err = se
	} else if err == nil && unseen != nil {
		err = unseen
	}
	if err := errors.Join(append(errs, err)...); err != nil {
		return redriven, err
	}
	var missing []string
	for _, id := range ids {
		if !found[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return redriven, fmt.Errorf("berth/sqs: dead letters %s of %s: %w", joinErrorText(missing), queue, sdk.ErrNotFound)
	}
	return redriven, nil
}

// redrive sends page's letters to s.q and deletes from the dead-letter queue
// those whose copy was sent, each by its own copy's outcome (never by its
// berth ID, which letters may share); it returns how many it deleted. A
// letter that cannot be encoded for the queue, or whose copy SQS refused,
// stays held; the refused are named by berth ID in an [*sdk.PublishError].
// A send slow enough for the page's hold to have lapsed is followed by a
// check of the holds: a letter another reader took meanwhile is not
// deleted (a stale receipt's delete succeeds and deletes nothing), and is
// reported with an error wrapping [sdk.ErrLeaseLost].
func (b *Broker) redrive(ctx context.Context, s *scan, page []*letter, sent *recentIDs) (int, error) {
	if len(page) == 0 {
		return 0, nil
	}
	began := time.Now()                 // the page was received, and its hold set, just before
	limit, err := b.wireLimit(ctx, s.q) // the queue's own limit, when below MaxWireSize
	if err != nil {
		return 0, err
	}
	var errs []error
	entries := make([]sendEntry, 0, len(page))
	sendable := make([]*letter, 0, len(page))
	for _, l := range page {
		m := l.msg.Clone()
		sdk.PrepareRedrive(m, s.q.name)
		e, err := b.entry(m, s.q.fifo, l.group, "", limit)
		if err != nil {
			errs = append(errs, err)
			l.msg = nil
			continue
		}
		entries = append(entries, e)
		sendable = append(sendable, l)
	}
	if len(entries) == 0 {
		return 0, errors.Join(errs...)
	}
	// Once the copies go out, the page is finished whatever ctx does (an
	// operator's Ctrl-C, a deadline): a send cut in flight may have been
	// done, and a letter whose copy was sent but whose delete was cut
	// would stay a dead letter, redriven again by the next call (a
	// duplicate job) and not counted by this one. ctx stops the call
	// between pages (s.next).
	pctx, cancel := finishCtx(ctx)
	defer cancel()
	// Each letter's outcome is its own entry's, by position: letters may
	// share a berth ID (a message dead-lettered twice), and the refusal of
	// one copy must not keep a letter whose copy was sent (it would be
	// redriven again: a duplicate job).
	failed, err := b.sendEach(pctx, s.q, entries)
	if err != nil {
		for _, l := range sendable { // held, not needed: a redrive of all goes on paging
			l.msg = nil
		}
		return 0, errors.Join(append(errs, err)...) // nothing was sent, unless err says it may have been
	}
	if failed != nil {
		errs = append(errs, &sdk.PublishError{Failed: byID(entries, failed)})
	}
	var done []*letter
	for i, l := range sendable {
		if failed == nil || failed[i] == nil {
			done = append(done, l)
			sent.add(l.msg.ID)
		}
		l.msg = nil
	}
	held := make([]*letter, 0, len(done))
	for _, l := range done {
		if l.handle != "" {
			held = append(held, l)
		}
	}
	if time.Since(began) >= s.b.scanHold/3 {
		// The send took long enough for the page's hold to lapse: another
		// reader may hold a letter now, and a delete with a stale receipt
		// succeeds and deletes nothing (the letter would stay, redriven
		// again by the next redrive). Checked as the acker checks a late
		// delete: a letter whose receipt no longer holds it is not
		// deleted, and is reported.
		if err := b.changeVisibilityBatch(pctx, s.dlq, held, s.b.scanHold); err != nil {
			return 0, errors.Join(append(errs, fmt.Errorf("berth/sqs: %d dead letters of %s were redriven but not deleted (their hold could not be checked): %w", len(done), s.dlq.name, err))...)
		}
	}
	held = held[:0]
	for _, l := range done {
		if l.handle == "" {
			errs = append(errs, fmt.Errorf("berth/sqs: dead letter %s of %s was redriven, but another reader took it while its copy was sent: it stays in the dead-letter queue: %w", l.sqsID, s.dlq.name, sdk.ErrLeaseLost))
			continue
		}
		held = append(held, l)
	}
	done = held
	gone, err := b.remove(pctx, s.dlq, done)
	s.forget(gone)
	return len(gone), errors.Join(append(errs, err)...)
}

// finishTimeout bounds the finishing of a page of a redrive or purge that
// ctx no longer bounds (see finishCtx): one send and one delete of at most
// a receive's letters.
const finishTimeout = 30 * time.Second

// finishCtx returns the context that finishes a page once begun: not cut
// when ctx is (nor by Close), bounded by finishTimeout.
func finishCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
}

// PurgeDeadLetters deletes every message of queue's dead-letter queue, page
// by page until receives find it empty, and returns how many it deleted
// (counted one by one, not through PurgeQueue, which SQS limits to once a
// minute and applies lazily). A ctx that ends stops it between pages: the
// page in hand is deleted and counted first. Dead letters another reader
// holds invisible until it gives up waiting for them stay, reported by a
// [*ScanError].
func (b *Broker) PurgeDeadLetters(ctx context.Context, queue string) (int, error) {
	return b.PurgeDeadLettersProgress(ctx, queue, nil)
}

// PurgeDeadLettersProgress is [Broker.PurgeDeadLetters] that calls progress,
// when not nil, with the running count of letters deleted after each page
// that deleted some: a purge of a large dead-letter queue deletes at most 10
// letters a receive, and takes minutes. It deletes exactly what
// PurgeDeadLetters does, and returns the same count and error; progress is
// called on the caller's goroutine.
func (b *Broker) PurgeDeadLettersProgress(ctx context.Context, queue string, progress func(done int)) (int, error) {
	total := 0
	err := b.withScan(ctx, queue, func(ctx context.Context, s *scan) error {
		s.whole = true
		for {
			ls, err := s.next(ctx)
			if err != nil {
				return err
			}
			if len(ls) == 0 {
				if se := s.unseenError(); se != nil {
					return se
				}
				return nil
			}
			// Not cut by ctx: a delete cut as SQS answers it was done,
			// and the count would miss it (ctx stops between pages).
			pctx, cancel := finishCtx(ctx)
			gone, err := b.remove(pctx, s.dlq, ls)
			cancel()
			s.forget(gone)
			total += len(gone)
			if progress != nil && len(gone) > 0 {
				progress(total)
			}
			if err != nil {
				return err
			}
		}
	})
	return total, err
}

// withScan runs fn on a scan of queue's dead-letter queue, then makes the
// letters the scan still holds visible again: also when fn panicked or
// exited its goroutine (a client middleware's, in a redrive's send), so
// that they are not hidden for the rest of a hold.
func (b *Broker) withScan(ctx context.Context, queue string, fn func(ctx context.Context, s *scan) error) (err error) {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	ctx, done := b.watch(ctx)
	defer done()
	q, err := b.queue(ctx, queue)
	if err != nil {
		return err
	}
	dlq, err := b.deadLetterQueue(ctx, q)
	if err != nil {
		return err
	}
	s := &scan{b: b, q: q, dlq: dlq, held: map[string]*letter{}, renewed: time.Now()}
	defer func() {
		var rest []*letter
		for _, l := range s.held {
			if l.handle != "" {
				rest = append(rest, l)
			}
		}
		// Release even when ctx is done, so that a cancelled scan does not
		// hide the dead letters for a whole hold.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err = errors.Join(err, b.changeVisibilityBatch(rctx, dlq, rest, 0))
	}()
	return fn(ctx, s)
}
