package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// Dead-letter walks.
//
// AMQP 0-9-1 has no way to read a queue without taking its messages, so
// listing, showing, redriving and deleting dead letters all walk the
// dead-letter queue once round, a page at a time: each page is taken with
// basic.get (unacknowledged), looked at, and then every letter of it is
// either kept — republished as it is, headers and x-death included, to the
// tail of the dead-letter queue — redriven to its queue, or deleted; the
// original is acked only once its copy is confirmed. After the n letters the
// queue held when the walk began, each has gone round once and the queue is
// in its old order again. Only one page is held at once, so memory stays
// bounded whatever the queue holds; the walk takes time in proportion to
// the queue.
//
// Keeping by republishing, not by closing the channel, is what keeps a
// listing from wearing dead letters out: a message returned by closing the
// channel (or nack) has its x-delivery-count raised on a quorum queue, and
// a delivery limit on the dead-letter queue would then drop it. A copy
// starts with no delivery count.

// Bounds of a walk.
const (
	// defaultWalkPage is how many dead letters a walk holds at once.
	defaultWalkPage = 100
	// defaultWalkBytes ends a page early once its bodies reach it (a page
	// always takes at least one letter, which the server limits in size).
	defaultWalkBytes = 32 << 20
	// walkStampHeader marks the copies a walk keeps with the walk's ID, so
	// that a walk that meets one of its own copies knows it has come round
	// early (another walk took letters from under it) and stops, instead of
	// seeing letters twice. It is removed from the messages berth returns.
	walkStampHeader = "x-berth-walk"
)

// walkTuning bounds the dead-letter walks of a Broker. Its zero value uses
// the defaults; tests set smaller pages.
type walkTuning struct {
	page  int          // letters held at once
	bytes int          // body bytes after which a page ends early
	peak  atomic.Int64 // the most letters one page has held (for tests)
	// afterCount, when set, runs once the walk has counted the queue (for
	// tests).
	afterCount func()
}

// limits returns the page bounds of a walk whose caller asked for pages of
// size (0: the default).
func (w *walkTuning) limits(size int) (page, bytes int) {
	page, bytes = w.page, w.bytes
	switch {
	case page > 0 && size > 0:
		page = min(page, size)
	case size > 0:
		page = size
	case page <= 0:
		page = defaultWalkPage
	}
	if bytes <= 0 {
		bytes = defaultWalkBytes
	}
	return page, bytes
}

// ErrScanIncomplete is wrapped by a [*ScanError].
var ErrScanIncomplete = errors.New("berth/rabbitmq: dead-letter walk incomplete")

// ScanError reports a dead-letter call that ended before it had looked at
// every dead letter it was asked to reach, for a reason other than a
// failed call (which is returned as it is). It wraps [ErrScanIncomplete].
type ScanError struct {
	Queue string // the queue whose dead letters were walked
	// Remaining is how many of the dead letters the queue held when the
	// walk began it did not look at (they are still there); more may be.
	Remaining int
	Reason    string
}

// Error says what remains and why.
func (e *ScanError) Error() string {
	return fmt.Sprintf("berth/rabbitmq: dead letters of %s: %d or more not looked at: %s", e.Queue, e.Remaining, e.Reason)
}

// Unwrap returns [ErrScanIncomplete].
func (e *ScanError) Unwrap() error { return ErrScanIncomplete }

// verdict is what a walk does with a dead letter it looked at.
type verdict uint8

const (
	keepIt    verdict = iota // republish it to the dead-letter queue
	redriveIt                // publish it to its queue, redrive counted
	dropIt                   // delete it
)

// walkLetter is a dead letter a walk holds, unacknowledged.
type walkLetter struct {
	tag  uint64
	msg  *sdk.Message
	keep carried         // what msg cannot hold, for a redrive's copy
	raw  amqp.Publishing // the dead letter as the server holds it, to keep it
	v    verdict
}

// walkResult counts a walk.
type walkResult struct {
	total    int // dead letters the queue held when the walk began
	seen     int // of them, looked at
	redriven int
	dropped  int
	// failed names the letters to redrive whose publish failed; they are
	// still dead letters.
	failed map[string]error
}

// withFailures returns err, the error that ended a walk (nil when none),
// with the redrives r met that failed: a *[sdk.PublishError] alone when err
// is nil, else a [*WalkError] holding both, so that a walk cut short still
// says what it could not do before the error.
func (r walkResult) withFailures(err error) error {
	if len(r.failed) == 0 {
		return err
	}
	pe := &sdk.PublishError{Failed: r.failed}
	if err == nil {
		return pe
	}
	return &WalkError{Err: err, Failed: pe}
}

// WalkError is the error of a redrive or sweep of dead letters that ended
// part-way (Err: a failed call, ctx, or a [*ScanError]) after some of the
// letters it was to redrive had failed (Failed: they are still dead
// letters). What it did move is the count returned with it. [errors.Is] and
// [errors.As] see both.
type WalkError struct {
	Err    error
	Failed *sdk.PublishError
}

// Error says why the walk ended and what had failed before.
func (e *WalkError) Error() string {
	return e.Err.Error() + "; before that, " + e.Failed.Error()
}

// Unwrap returns Err and Failed.
func (e *WalkError) Unwrap() []error { return []error{e.Err, e.Failed} }

// walk goes once round queue's dead-letter queue a page at a time (size
// letters, 0 for the default, and at most the byte bound), calling
// fn with each page; fn sets each letter's verdict (keepIt by default) and
// must not keep the page. A page is finished (its letters kept, redriven or
// deleted) even when ctx is done during it; ctx is checked between pages,
// and an interrupted walk leaves the queue turned part of the way round:
// nothing lost, the order changed. It returns what it did, with an error
// when a call failed, ctx ended the walk, or (a *ScanError) another walk
// took letters from under it.
func (b *Broker) walk(ctx context.Context, queue string, size int, fn func(page []*walkLetter)) (walkResult, error) {
	var r walkResult
	if b.closed() {
		return r, sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return r, err
	}
	dlq := DeadLetterQueue(queue)
	conn, err := b.pub.get(ctx)
	if err != nil {
		return r, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return r, fmt.Errorf("%w: rabbitmq: open channel: %w", sdk.ErrUnavailable, err)
	}
	readErr := func(err error) error {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return fmt.Errorf("%w: rabbitmq: dead-letter queue %q: %w", sdk.ErrNotFound, dlq, err)
		}
		return fmt.Errorf("%w: rabbitmq: read dead-letter queue %q: %w", sdk.ErrUnavailable, dlq, err)
	}
	q, err := ch.QueueDeclarePassive(dlq, true, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return r, readErr(err)
	}
	defer b.endWalk(ch)
	r.total = q.Messages
	if b.walkTune.afterCount != nil {
		b.walkTune.afterCount()
	}
	stamp := sdk.NewID()
	pageMax, bytesMax := b.walkTune.limits(size)
	for r.seen < r.total {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		var page []*walkLetter
		var own []amqp.Delivery // this walk's own copies, met early
		size := 0
		drained := false
		for len(page) < pageMax && r.seen+len(page) < r.total && (len(page) == 0 || size < bytesMax) {
			d, ok, err := ch.Get(dlq, false)
			if err != nil {
				// The channel is gone: the server returns the page.
				return r, readErr(err)
			}
			if !ok {
				drained = true // others took the rest
				break
			}
			if s, _ := d.Headers[walkStampHeader].(string); s == stamp {
				own = append(own, d)
				break
			}
			page = append(page, b.walkLetter(d, queue))
			size += len(d.Body)
			if n := int64(len(page)); n > b.walkTune.peak.Load() {
				b.walkTune.peak.Store(n)
			}
		}
		if len(page) > 0 {
			fn(page)
		}
		if err := b.finishPage(ctx, ch, queue, stamp, page, own, &r); err != nil {
			return r, err
		}
		r.seen += len(page)
		if len(own) > 0 {
			return r, &ScanError{Queue: queue, Remaining: r.total - r.seen,
				Reason: "another walk of the dead-letter queue (a listing, a redrive) moved letters from under this one; run it again"}
		}
		if drained {
			break
		}
	}
	return r, nil
}

// walkLetter decodes d, a dead letter of queue.
func (b *Broker) walkLetter(d amqp.Delivery, queue string) *walkLetter {
	dec := decode(d.Headers, d.MessageId, d.Type, d.CorrelationId, d.Body)
	m := dec.msg
	delete(m.Headers, walkStampHeader)
	annotateBrokerDeath(m, d.Headers, queue)
	raw := amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: d.Priority, CorrelationId: d.CorrelationId,
		ReplyTo: d.ReplyTo, Expiration: d.Expiration, MessageId: d.MessageId, Timestamp: d.Timestamp,
		Type: d.Type, AppId: d.AppId, Body: d.Body, // not UserId: the server checks it against the login
	}
	raw.Headers = maps.Clone(raw.Headers)
	if raw.Headers == nil {
		raw.Headers = amqp.Table{}
	}
	delete(raw.Headers, "x-delivery-count")
	return &walkLetter{tag: d.DeliveryTag, msg: m, keep: carriedOf(d, dec.extra), raw: raw}
}

// finishPage publishes the page's kept letters (stamped) to the tail of
// the dead-letter queue and its redriven ones to queue, in one pipelined
// batch, then acks every original whose copy was confirmed and every
// deleted one. A letter whose copy failed stays unacknowledged and goes
// back when the walk's channel closes (with a delivery counted). own are
// this walk's copies met again: kept once more, unstamped changes nothing.
// The caller's ctx does not cut a page: a walk that is cancelled still
// finishes the page it holds, within CloseTimeout.
func (b *Broker) finishPage(ctx context.Context, ch *amqp.Channel, queue, stamp string, page []*walkLetter, own []amqp.Delivery, r *walkResult) error {
	now := time.Now()
	dlq := DeadLetterQueue(queue)
	out := make([]outgoing, 0, len(page)+len(own))
	// at[i] is the position in out of page[i]'s copy (-1: deleted, none).
	// Outcomes are read by position, never by ID: letters without an ID,
	// or with one ID, are common (see sendEach).
	at := make([]int, len(page))
	for i, l := range page {
		at[i] = -1
		switch l.v {
		case keepIt:
			l.raw.Headers[walkStampHeader] = stamp
			at[i] = len(out)
			out = append(out, outgoing{id: l.msg.ID, key: dlq, pub: l.raw})
		case redriveIt:
			// The target is the queue whose dead-letter queue this is,
			// never the berth-dlq-queue header: a message can carry a
			// forged one.
			sdk.PrepareRedrive(l.msg, queue)
			at[i] = len(out)
			out = append(out, outgoing{id: l.msg.ID, key: queue, pub: l.keep.apply(encode(l.msg, 1, now))})
		}
	}
	ownAt := len(out)
	for _, d := range own {
		out = append(out, outgoing{id: d.MessageId, key: dlq, pub: b.walkLetter(d, queue).raw})
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(b.opts.CloseTimeout, 5*time.Second))
	defer cancel()
	fail := func(id string, err error) {
		if r.failed == nil {
			r.failed = map[string]error{}
		}
		r.failed[id] = err
	}
	var failed []error
	if len(out) > 0 {
		var err error
		failed, err = b.sendEach(pctx, out)
		if errors.Is(err, sdk.ErrClosed) {
			// Nothing of the page was sent (Close took the channel): its
			// letters all go back, and those to redrive say so.
			for _, l := range page {
				if l.v == redriveIt {
					fail(l.msg.ID, sdk.ErrClosed)
				}
			}
			return sdk.ErrClosed
		}
		if err != nil { // no channel: every copy failed
			failed = make([]error, len(out))
			for i := range failed {
				failed[i] = err
			}
		}
	}
	// copyErr is the failure of out[i]'s copy, nil when confirmed.
	copyErr := func(i int) error {
		if i < 0 || failed == nil {
			return nil
		}
		return failed[i]
	}
	ack := func(tag uint64, id string) error {
		if err := ch.Ack(tag, false); err != nil {
			// The copy is out; the original goes back too: twice, never none.
			return fmt.Errorf("%w: rabbitmq: remove dead letter %s after copying it: %w", sdk.ErrUnavailable, sdk.ErrorText(id), err)
		}
		return nil
	}
	for i, l := range page {
		if cerr := copyErr(at[i]); cerr != nil {
			if l.v == redriveIt {
				fail(l.msg.ID, cerr)
			}
			continue
		}
		if err := ack(l.tag, l.msg.ID); err != nil {
			// This letter and the rest of the page go back to the
			// dead-letter queue: those to redrive whose copy is out are
			// now on both queues, and say so.
			for j, l := range page[i:] {
				switch cerr := copyErr(at[i+j]); {
				case l.v != redriveIt:
				case cerr != nil:
					fail(l.msg.ID, cerr)
				default:
					fail(l.msg.ID, fmt.Errorf("%w: rabbitmq: redriven, but the dead letter could not be removed (it is on both queues): %w", sdk.ErrUnavailable, err))
				}
			}
			return err
		}
		switch l.v {
		case redriveIt:
			r.redriven++
		case dropIt:
			r.dropped++
		}
	}
	for i, d := range own {
		if copyErr(ownAt+i) == nil {
			if err := ack(d.DeliveryTag, d.MessageId); err != nil {
				return err
			}
		}
	}
	return nil
}

// endWalk closes a walk's channel once the server has had time to apply
// its acks (see consumer.handBack); letters still unacknowledged go back.
func (b *Broker) endWalk(ch *amqp.Channel) {
	defer ch.Close()
	if ch.IsClosed() {
		return
	}
	t := time.NewTimer(settleGrace)
	defer t.Stop()
	select {
	case <-t.C:
	case <-b.closing:
	}
}

// ListDeadLetters returns up to limit messages of queue's dead-letter queue,
// oldest first, with their reason headers (messages the server
// dead-lettered through the delivery limit get them from x-death). It walks
// the whole dead-letter queue once round, a page at a time, and leaves it as
// it was, with no delivery counted (see the package doc): memory holds one
// page and the limit messages returned. When another walk took letters from
// under it before it had limit of them, it returns those it has with a
// [*ScanError].
func (b *Broker) ListDeadLetters(ctx context.Context, queue string, limit int) ([]*sdk.Message, error) {
	if limit <= 0 {
		limit = sdk.DefaultListLimit
	}
	var out []*sdk.Message
	_, err := b.walk(ctx, queue, 0, func(page []*walkLetter) {
		for _, l := range page {
			if len(out) < limit {
				out = append(out, l.msg)
			}
		}
	})
	if err != nil && (len(out) < limit || !errors.Is(err, ErrScanIncomplete)) {
		return out, err
	}
	return out, nil
}

// GetDeadLetter returns the dead letter with message ID id, or an error
// wrapping [sdk.ErrNotFound] (or a [*ScanError] when another walk took
// letters from under it and it did not find id). It walks the whole
// dead-letter queue once round, holding one page at a time.
func (b *Broker) GetDeadLetter(ctx context.Context, queue, id string) (*sdk.Message, error) {
	var found *sdk.Message
	_, err := b.walk(ctx, queue, 0, func(page []*walkLetter) {
		for _, l := range page {
			if found == nil && l.msg.ID == id {
				found = l.msg
			}
		}
	})
	switch {
	case found != nil && (err == nil || errors.Is(err, ErrScanIncomplete)):
		return found, nil
	case err != nil:
		return nil, err
	}
	return nil, fmt.Errorf("%w: dead letter %s in %q", sdk.ErrNotFound, sdk.ErrorText(id), DeadLetterQueue(queue))
}

// RedriveDeadLetters publishes the dead letters with the given IDs (all
// when none) back to queue, the queue whose dead-letter queue holds them
// (whatever their berth-dlq-queue header says) with attempts reset and the
// redrive counted ([sdk.PrepareRedrive]), and removes each from the
// dead-letter queue once its copy is confirmed. It walks the dead-letter
// queue a page at a time (see the package doc), so memory stays bounded
// however many it redrives; with IDs it first walks once to check them:
// unknown IDs give an error wrapping [sdk.ErrNotFound] and redrive nothing.
// It returns how many were redriven, with a *[sdk.PublishError] naming
// those whose publish failed (they stay dead letters) or a [*ScanError]
// when another walk took letters from under it. A redrive that ends
// part-way (a failed call, ctx) still returns how many it redrove, and
// when some had failed before the error, a [*WalkError] naming them too.
func (b *Broker) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	return b.moveDeadLetters(ctx, queue, redriveIt, ids)
}

// DeleteDeadLetters deletes the dead letters with the given IDs (all when
// none; [Broker.PurgeDeadLetters] does that in one call) from queue's
// dead-letter queue and returns how many. Like [Broker.RedriveDeadLetters]
// it checks the IDs first: unknown IDs give an error wrapping
// [sdk.ErrNotFound] and delete nothing.
func (b *Broker) DeleteDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	return b.moveDeadLetters(ctx, queue, dropIt, ids)
}

func (b *Broker) moveDeadLetters(ctx context.Context, queue string, v verdict, ids []string) (int, error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = false
	}
	if len(ids) > 0 {
		_, err := b.walk(ctx, queue, 0, func(page []*walkLetter) {
			for _, l := range page {
				if _, ok := want[l.msg.ID]; ok {
					want[l.msg.ID] = true
				}
			}
		})
		if err != nil {
			return 0, err
		}
		for _, id := range ids {
			if !want[id] {
				return 0, fmt.Errorf("%w: dead letter %s in %q", sdk.ErrNotFound, sdk.ErrorText(id), DeadLetterQueue(queue))
			}
		}
	}
	if v == redriveIt {
		if err := b.ensure(ctx, queue); err != nil {
			return 0, err
		}
	}
	r, err := b.walk(ctx, queue, 0, func(page []*walkLetter) {
		for _, l := range page {
			if _, ok := want[l.msg.ID]; ok || len(ids) == 0 {
				l.v = v
			}
		}
	})
	n := r.redriven + r.dropped
	err = r.withFailures(err)
	// IDs checked but gone by the second walk (another operator) are
	// counted by n < len(ids), without an error.
	return n, err
}

// SweepDeadLetters goes once round queue's dead-letter queue, size letters
// at a time (0: 100; a page also ends once its bodies reach 32 MiB), and
// acts on the letters fn chooses as it goes: fn is called with each page
// (it must not keep it) and done, how many fn chose in earlier pages, and
// returns for each letter of the page whether to act on it (nil: none).
// Acting is redriving when redrive is true (as [Broker.RedriveDeadLetters]
// does), deleting otherwise; the letters not chosen are kept in order (see
// the package doc). Memory holds one page, however many letters there are.
// It returns how many were acted on, with a *[sdk.PublishError] naming the
// chosen letters whose redrive failed (they stay dead letters), ctx.Err()
// when ctx ended the sweep between pages (the page in hand is finished),
// or a [*ScanError] when another walk took letters from under it. A sweep
// that ends part-way still returns how many it acted on, and when some
// redrives had failed before the error, a [*WalkError] naming them with
// it. The berth command uses it to redrive and purge in one pass.
func (b *Broker) SweepDeadLetters(ctx context.Context, queue string, size int, redrive bool, fn func(done int, page []*sdk.Message) []bool) (int, error) {
	v := dropIt
	if redrive {
		v = redriveIt
		if err := b.ensure(ctx, queue); err != nil {
			return 0, err
		}
	}
	done := 0
	var msgs []*sdk.Message
	r, err := b.walk(ctx, queue, size, func(page []*walkLetter) {
		msgs = msgs[:0]
		for _, l := range page {
			msgs = append(msgs, l.msg)
		}
		chosen := fn(done, msgs)
		clear(msgs)
		for i, c := range chosen {
			if c && i < len(page) {
				page[i].v = v
				done++
			}
		}
	})
	n := r.redriven + r.dropped
	err = r.withFailures(err)
	return n, err
}
