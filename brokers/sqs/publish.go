package sqs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/berthq/berth/sdk"
)

// Publish sends msgs to queue with SendMessageBatch, in chunks of at most 10
// messages and 1 MiB: up to 10 chunks at once on a standard queue, one after
// another (in order) on a FIFO queue. Concurrent Publish calls of at most 10
// messages to a standard queue share calls when [Options.PublishSenders] are
// busy. It implements [sdk.Publisher]: every message is checked first
// ([sdk.Prepare], the delay: [*DelayError], the sizes: an
// [*sdk.MessageTooLargeError] whose Limit is [Options.MaxWireSize], or the
// queue's own MaximumMessageSize when smaller, less 83 bytes kept for the
// copies berth sends of it) and nothing is sent when one fails. Entries SQS
// refuses, and the messages of chunks not sent after a failed call, are
// named in an [*sdk.PublishError]; the other messages were published. On a
// FIFO queue a message group stops at its first message not published:
// once SQS refuses an entry (or leaves one unaccounted for), the group's
// later messages in later calls of the Publish are not sent, and are named
// in the PublishError with an error wrapping [ErrGroupHalted], so that none
// is stored ahead of it; the other groups go on. Messages of the group in
// the same call as the refused one (a call carries at most 10) are SQS's
// to take or refuse: berth cannot hold them back. When
// every call failed it returns a call's error instead: one that says the
// messages may have been published all the same ([sdk.ErrUnavailable],
// [sdk.ErrClosed], ctx's error) when any call's does. A call whose answer
// was lost — cut short, or on an attempt the SDK then retried, whatever the
// last attempt's answer — or whose success answer failed a check of the
// client's (the SDK's MD5 check of the bodies) fails with
// [sdk.ErrUnavailable], as does an entry SQS's answer leaves unaccounted
// for, or refuses in its answer to the SDK's retry of an attempt whose
// answer was lost: their messages may have been published. A panic in one of its
// SendMessageBatch calls (a client middleware's) is raised in the caller's
// goroutine, whichever goroutine made the call, as is a runtime.Goexit; no
// further call of the Publish starts. (A shared call that carries other
// Publish calls' messages goes on when the caller's ctx ends, and the
// caller returns ctx's error at once: a panic of that call after it
// returned is logged.) Messages of the other calls (already
// made, or in flight alongside it) may then have been published, and the
// panic does not say which: a caller that recovers and publishes the
// messages again may publish some of them twice.
func (b *Broker) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if err := validateQueueName(queue); err != nil {
		return err
	}
	if err := sdk.PrepareAll(ctx, queue, msgs, b.opts.MaxMessageSize); err != nil {
		return err
	}
	fifo := isFIFOName(queue)
	entries := make([]sendEntry, len(msgs))
	for i, m := range msgs {
		e, err := b.entry(m, fifo, "", "", b.opts.MaxWireSize-copyReserve)
		if err != nil {
			return err
		}
		entries[i] = e
	}
	if len(entries) == 0 {
		return nil
	}
	q := b.cached(queue)
	if q == nil {
		wctx, done := b.watch(ctx)
		var err error
		q, err = b.queue(wctx, queue)
		done()
		if err != nil {
			return err
		}
	}
	// The queue's own MaximumMessageSize, when below MaxWireSize (a queue
	// made outside berth): a message over it is refused here, typed, with
	// nothing of the batch sent, not by SQS entry by entry.
	limit, err := b.wireLimit(ctx, q)
	if err != nil {
		return err
	}
	if limit < b.opts.MaxWireSize {
		for _, e := range entries {
			if e.enc.size > limit-copyReserve {
				return &sdk.MessageTooLargeError{ID: e.id, Size: e.enc.size, Limit: limit - copyReserve}
			}
		}
	}
	if !q.fifo && len(entries) <= batchSize && wireSize(entries) <= b.opts.MaxWireSize {
		return b.publishShared(ctx, q, entries) // watches the broker's closing itself
	}
	ctx, done := b.watch(ctx)
	defer done()
	return b.send(ctx, q, entries)
}

// wireSize is the encoded size of entries together.
func wireSize(entries []sendEntry) int {
	n := 0
	for _, e := range entries {
		n += e.enc.size
	}
	return n
}

// sendEntry is one message ready for SendMessageBatch.
type sendEntry struct {
	id  string // berth message ID
	enc encoded
	in  sqstypes.SendMessageBatchRequestEntry
	// sent, when not nil, gets the SQS MessageId SQS gave the entry once
	// it was published (DeadLetter's copy, which it may have to take back).
	sent *string
}

// entry checks and encodes m for a queue (FIFO or not), refusing it with a
// [*sdk.MessageTooLargeError] when its encoded size is over limit: Publish
// passes [Options.MaxWireSize] less [copyReserve], the copies berth sends
// of a message (dead letter, redrive) MaxWireSize itself. dedupSalt, when
// not empty, makes the FIFO deduplication ID differ from an earlier send of
// the same message (dead-lettering, redrive). group, when not empty, is the
// FIFO message group the message was received with, which a copy of it
// keeps (see [receivedGroup]); when empty, the group is m.Key, or
// [Options.DefaultGroup] when m has no Key.
func (b *Broker) entry(m *sdk.Message, fifo bool, group, dedupSalt string, limit int) (sendEntry, error) {
	if m.Delay > 0 {
		if fifo {
			return sendEntry{}, &DelayError{ID: m.ID, Delay: m.Delay}
		}
		if m.Delay > MaxPublishDelay {
			return sendEntry{}, &DelayError{ID: m.ID, Delay: m.Delay, Max: MaxPublishDelay}
		}
	}
	enc, err := encode(m)
	if err != nil {
		return sendEntry{}, err
	}
	if enc.size > limit {
		return sendEntry{}, &sdk.MessageTooLargeError{ID: m.ID, Size: enc.size, Limit: limit}
	}
	in := sqstypes.SendMessageBatchRequestEntry{
		MessageBody:       aws.String(enc.body),
		MessageAttributes: enc.attrs,
	}
	if m.Delay > 0 {
		in.DelaySeconds = ceilSeconds(m.Delay)
	}
	if fifo {
		if group == "" {
			group = m.Key
		}
		if group == "" {
			group = b.opts.DefaultGroup
		}
		dedup := m.IdempotencyKey
		if dedup == "" {
			dedup = m.ID
		}
		if n := m.Header(sdk.HeaderRedriveCount); n != "" {
			dedup += "#redrive-" + n
		}
		if dedupSalt != "" {
			dedup += "#" + dedupSalt
		}
		in.MessageGroupId = aws.String(fifoToken(group))
		in.MessageDeduplicationId = aws.String(fifoToken(dedup))
	}
	return sendEntry{id: m.ID, enc: enc, in: in}, nil
}

// publishParallel bounds the SendMessageBatch calls one Publish to a
// standard queue makes at once: a Publish of up to 100 messages takes one
// round trip, not ten.
const publishParallel = 10

// send publishes entries to q (see sendEach). When every call failed, send
// returns the first call's error, or the first that leaves its messages
// perhaps published ([uncertain]) when there is one; otherwise the entries
// of failed calls and those SQS refused are named by message ID in an
// [*sdk.PublishError]: for Publish, whose messages [sdk.Prepare] gave IDs.
// Copies of received messages, whose IDs may repeat, go through sendEach.
func (b *Broker) send(ctx context.Context, q *queueRef, entries []sendEntry) error {
	failed, err := b.sendEach(ctx, q, entries)
	if err != nil {
		return err
	}
	if failed == nil {
		return nil
	}
	return &sdk.PublishError{Failed: byID(entries, failed)}
}

// byID is failed (by position in entries, as sendEach returns it) keyed by
// the entries' message IDs.
func byID(entries []sendEntry, failed []error) map[string]error {
	m := map[string]error{}
	for i, err := range failed {
		if err != nil {
			m[entries[i].id] = err
		}
	}
	return m
}

// sendEach publishes entries to q in batches of at most 10 entries and
// MaxWireSize bytes: one after another on a FIFO queue (they keep their
// order, and a message group stops at its first entry not published: see
// Publish), up to publishParallel at once on a standard queue. It returns
// nil, nil when every entry was published. When every call failed, err is
// the first call's error, or the first that leaves its messages perhaps
// published ([uncertain]) when there is one, and failed is nil; otherwise
// failed holds, by position, why each entry was not published (failed[i]
// is entries[i]'s, nil when published). Entries are told apart by
// position, never by message ID: the copies berth sends of received
// messages (a redrive of dead letters) carry the IDs their producers gave,
// which may repeat (a message dead-lettered twice), and one copy's outcome
// must not be taken for another's.
func (b *Broker) sendEach(ctx context.Context, q *queueRef, entries []sendEntry) (failed []error, err error) {
	type span struct{ start, end int } // a chunk: entries[start:end]
	var chunks []span
	for start := 0; start < len(entries); {
		end, size := start, 0
		for end < len(entries) && end-start < batchSize && size+entries[end].enc.size <= b.opts.MaxWireSize {
			size += entries[end].enc.size
			end++
		}
		chunks = append(chunks, span{start, end})
		start = end
	}
	fail := func(i int, err error) {
		if failed == nil { // allocated on the first failure
			failed = make([]error, len(entries))
		}
		failed[i] = err
	}
	if len(chunks) == 1 || q.fifo {
		var halted map[string]error // FIFO message groups with an entry not published: why
		for ci, c := range chunks {
			chunk := entries[c.start:c.end]
			var at []int // the positions of chunk's entries, when some are held back
			if len(halted) > 0 {
				chunk = nil
				for i := c.start; i < c.end; i++ {
					if err, ok := halted[aws.ToString(entries[i].in.MessageGroupId)]; ok {
						fail(i, err)
						continue
					}
					at = append(at, i)
					chunk = append(chunk, entries[i])
				}
				if len(chunk) == 0 {
					continue
				}
			}
			refused, err := b.sendBatch(ctx, q, chunk)
			if err != nil {
				if failed == nil && ci == 0 {
					return nil, err // nothing was published
				}
				for i := c.start; i < len(entries); i++ {
					if failed == nil || failed[i] == nil {
						fail(i, err)
					}
				}
				break
			}
			for j, rerr := range refused {
				switch {
				case rerr == nil:
				case at != nil:
					fail(at[j], rerr)
				default:
					fail(c.start+j, rerr)
				}
			}
			if q.fifo && ci < len(chunks)-1 {
				halted = haltGroups(halted, chunk, refused)
			}
		}
		return failed, nil
	}
	errs := make([]error, len(chunks))
	outcome := make([]error, len(entries)) // each chunk's goroutine writes its own span
	// A call that panicked (a client middleware's) or exited its
	// goroutine: raised again here, in the Publish caller's goroutine,
	// where it can be recovered (on the chunk's it would end the
	// process), as a shared call's is (senderPool).
	// Once one has, no further chunk is sent: the caller is not told
	// which were (a panic carries no PublishError), so as few as
	// possible go out, as when a call panics on a FIFO queue.
	ends := make([]abend, len(chunks))
	var ended atomic.Bool
	sem := make(chan struct{}, publishParallel)
	var wg sync.WaitGroup
	for ci, c := range chunks {
		sem <- struct{}{}
		if ended.Load() { // set before the ended call's token went
			<-sem
			break
		}
		wg.Go(func() {
			defer func() {
				if ends[ci].panicked || ends[ci].exited {
					ended.Store(true)
				}
				<-sem
			}()
			guard(&ends[ci], func() {
				refused, err := b.sendBatch(ctx, q, entries[c.start:c.end])
				if err != nil {
					errs[ci] = err
					for i := c.start; i < c.end; i++ {
						outcome[i] = err
					}
					return
				}
				copy(outcome[c.start:c.end], refused)
			})
		})
	}
	wg.Wait()
	for _, end := range ends {
		end.raise()
	}
	allFailed := true
	for _, err := range errs {
		allFailed = allFailed && err != nil
	}
	if allFailed {
		return nil, firstUncertain(errs) // nothing was published, unless it says so
	}
	for i, err := range outcome {
		if err != nil {
			fail(i, err)
		}
	}
	return failed, nil
}

// ErrGroupHalted is wrapped by the error a FIFO Publish gives, in its
// [*sdk.PublishError], to a message it did not send because an earlier
// message of the same message group, in an earlier SendMessageBatch call of
// the same Publish, was not published (SQS refused its entry, or left it
// unaccounted for): sending it would have stored it ahead of that one. It
// was not published; publish it again after the earlier message.
var ErrGroupHalted = errors.New("berth/sqs: not sent: an earlier message of its FIFO message group was not published")

// haltGroups adds to halted (made when nil) the message groups of chunk's
// entries that refused (as sendBatch returned it) says were not published,
// with the first such entry's error, and returns it.
func haltGroups(halted map[string]error, chunk []sendEntry, refused []error) map[string]error {
	for i, err := range refused {
		if err == nil {
			continue
		}
		if halted == nil {
			halted = map[string]error{}
		}
		g := aws.ToString(chunk[i].in.MessageGroupId)
		if _, ok := halted[g]; !ok {
			halted[g] = fmt.Errorf("%w (message %s: %v)", ErrGroupHalted, sdk.ErrorText(chunk[i].id), err)
		}
	}
	return halted
}

// uncertain reports whether a failed call's messages may have been
// published all the same: the call was cut short (its ctx, Close) or its
// answer was lost (a transport failure, [sdk.ErrUnavailable]). The error of
// any other failed call (SQS's answer) says that none of them was.
func uncertain(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, sdk.ErrClosed) || errors.Is(err, sdk.ErrUnavailable)
}

// firstUncertain is the error of a Publish whose calls all failed, errs
// (none nil): the first that leaves its messages perhaps published, else
// the first. A Publish whose first call SQS refused while a later one was
// cut short must not say that nothing was published.
func firstUncertain(errs []error) error {
	for _, err := range errs {
		if uncertain(err) {
			return err
		}
	}
	return errs[0]
}

// sendBatch sends one SendMessageBatch call. refused holds, by position in
// chunk, why each entry was not published (nil: published): outcomes are
// kept by entry, not by message ID, since entries of different Publish calls
// sharing a call may carry the same ID. An entry SQS refused in its answer
// to a retry of the call, after an attempt whose answer was lost, may have
// been published by that attempt: its [*EntryError] is wrapped with
// [sdk.ErrUnavailable], unless SQS said the entry itself was wrong
// (SenderFault), which it was in the lost attempt too. err is that of the call itself (refused is then
// nil).
func (b *Broker) sendBatch(ctx context.Context, q *queueRef, chunk []sendEntry) (refused []error, err error) {
	in := &awssqs.SendMessageBatchInput{QueueUrl: aws.String(q.url), Entries: make([]sqstypes.SendMessageBatchRequestEntry, len(chunk))}
	for i, e := range chunk {
		in.Entries[i] = e.in
		in.Entries[i].Id = aws.String(strconv.Itoa(i))
	}
	var seen attempts
	out, err := b.client.SendMessageBatch(ctx, in, watchAttempts(&seen), withBody)
	if err != nil {
		if sizeRefused(err) {
			q.size.stale() // the queue's MaximumMessageSize may have been lowered
		}
		_, err = seen.uncertain(b.wrap(ctx, "publish to "+q.name, err))
		return nil, err
	}
	refused = make([]error, len(chunk))
	ok := make([]bool, len(chunk))
	for _, r := range out.Successful {
		if i, err := strconv.Atoi(aws.ToString(r.Id)); err == nil && i >= 0 && i < len(chunk) {
			ok[i] = true
			if chunk[i].sent != nil {
				*chunk[i].sent = aws.ToString(r.MessageId)
			}
		}
	}
	for _, f := range out.Failed {
		i, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || i < 0 || i >= len(chunk) {
			continue
		}
		ok[i] = true // accounted for below
		refused[i] = &EntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
		if sizeRefused(refused[i]) {
			q.size.stale() // the queue's MaximumMessageSize may have been lowered
		}
		if seen.lost.Load() != nil && !f.SenderFault {
			// The refusal is the answer to a retry: the attempt whose
			// answer was lost may have published the entry all the same.
			// (Not when the entry itself was wrong: the lost attempt sent
			// the same entry, and was refused too.)
			refused[i] = fmt.Errorf("%w (an earlier attempt's answer was lost): %w", refused[i], sdk.ErrUnavailable)
		}
	}
	for i, done := range ok {
		if !done { // in neither list: never silently assume success, nor failure
			refused[i] = unanswered("this entry")
		}
	}
	return refused, nil
}

// attempts is what watchAttempts saw of a call's attempts.
type attempts struct {
	lost     atomic.Pointer[error] // the first attempt that failed without SQS's answer (lostAttempt)
	answered atomic.Bool           // an attempt got SQS's success answer
	started  atomic.Int64          // when the latest attempt started (Unix nanoseconds), 0 before the first
}

// lostErr is the error of the call's first attempt whose answer was lost, or
// nil.
func (seen *attempts) lostErr() error {
	if p := seen.lost.Load(); p != nil {
		return *p
	}
	return nil
}

// uncertain reports whether an attempt may have reached SQS although the
// call failed, and returns err, the call's wrapped error, wrapping
// sdk.ErrUnavailable when one did: an attempt whose answer
// was lost (the SDK retried; SQS may have acted on it, whatever the last
// attempt's answer says) or one with SQS's success answer (a check made
// after the retry loop failed — the SDK's MD5 check of the bodies: SQS
// acted). An err already uncertain (cut short, Close, SQS unreachable) is
// returned as it is.
func (seen *attempts) uncertain(err error) (bool, error) {
	switch {
	case uncertain(err):
	case seen.lost.Load() != nil:
		return true, fmt.Errorf("%w (an earlier attempt's answer was lost): %w", err, sdk.ErrUnavailable)
	case seen.answered.Load():
		return true, fmt.Errorf("%w (after SQS's success answer): %w", err, sdk.ErrUnavailable)
	}
	return false, err
}

// watchAttempts is a call option that notes in seen the first attempt of
// the call (the SDK's retries make several) that fails without SQS's answer
// ([lostAttempt]: a transport failure, an answer cut short, a gateway's 502
// or 504, the attempt's ctx), whether one gets SQS's success answer, and
// when the latest attempt started (see [polls]). The call's own error is
// only its last attempt's, which may be a refusal that says nothing of what
// an earlier attempt published, or that of a check made after the retry
// loop (the SDK's MD5 check of the answer), which says nothing of what SQS
// took.
func watchAttempts(seen *attempts) func(*awssqs.Options) {
	return awssqs.WithAPIOptions(func(s *middleware.Stack) error {
		return s.Finalize.Add(middleware.FinalizeMiddlewareFunc("berthAttemptLost",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				seen.started.Store(time.Now().UnixNano())
				out, md, err := next.HandleFinalize(ctx, in)
				switch {
				case err == nil:
					seen.answered.Store(true)
				case lostAttempt(err):
					seen.lost.CompareAndSwap(nil, &err)
				}
				return out, md, err
			}), middleware.After) // inside the SDK's retry loop: once an attempt
	})
}

// EntryError is the failure of one entry of an SQS batch call, as SQS
// reported it.
type EntryError struct {
	Code        string
	Message     string
	SenderFault bool // the request was wrong; sending it again fails again
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("SQS refused the entry: %s: %s", e.Code, e.Message)
}

// ceilSeconds converts d to whole seconds, rounding up so that a delay or a
// visibility is never shorter than asked. A d beyond SQS's int32 seconds
// (about 68 years) gives math.MaxInt32, not a wrapped-around value, so that
// the 12-hour ceiling check refuses it (or, for Retry, clamps it).
func ceilSeconds(d time.Duration) int32 {
	if d <= 0 {
		return 0
	}
	s := d / time.Second
	if d%time.Second != 0 {
		s++
	}
	return int32(min(s, math.MaxInt32))
}

// isFIFOName reports whether queue names a FIFO queue.
func isFIFOName(queue string) bool {
	return len(queue) > len(fifoSuffix) && queue[len(queue)-len(fifoSuffix):] == fifoSuffix
}
