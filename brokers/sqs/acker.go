package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// maxSurfaced bounds the delete failures kept for the next Flush; more are
// logged and counted.
const maxSurfaced = 100

// entryRetries is how many times a delete entry that SQS failed on its own
// side (not the sender's fault) is sent again.
const entryRetries = 2

// ackEntry is one buffered delete.
type ackEntry struct {
	queue  string
	id     string // berth message ID, for errors
	handle string
	w      *ackWaiter // nil: nobody waits; the result goes to surfaced
	tries  int
	gen    uint64 // the acker's generation when it was added (see flush)
	// deadline is when the delivery's lease ends by its own count (at the
	// Ack or DeadLetter), received when it was received (for SQS's 12-hour
	// ceiling): a delete sent after the deadline is checked first (confirm).
	deadline time.Time
	received time.Time
}

// unanswered is the error of an entry that SQS's answer to a batch call
// names neither among the successful nor among the failed ones: what SQS
// did with it is unknown, as with a lost answer, hence sdk.ErrUnavailable.
func unanswered(what string) error {
	return fmt.Errorf("berth/sqs: SQS reported neither success nor failure for %s: %w", what, sdk.ErrUnavailable)
}

// ackWaiter is a caller waiting for its delete's result (a SyncAck Ack, a
// DeadLetter). A caller that stops waiting (its ctx ended) leaves the
// result to the acker, which then logs a failure and returns it from the
// next Flush, as for a buffered delete: a refused delete means the message
// runs again, and someone must hear of it.
type ackWaiter struct {
	done  chan error   // holds the result once finish claimed it
	state atomic.Int32 // waiterWaiting, then waiterAnswered (finish) or waiterGone (wait)
}

// The states of an ackWaiter.
const (
	waiterWaiting = iota
	waiterAnswered
	waiterGone
)

func newAckWaiter() *ackWaiter { return &ackWaiter{done: make(chan error, 1)} }

// wait returns the delete's result, or ctx's error once ctx ends first —
// unless the result was claimed meanwhile: it is then on its way, and
// returned.
func (w *ackWaiter) wait(ctx context.Context) error {
	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
		if w.state.CompareAndSwap(waiterWaiting, waiterGone) {
			return ctx.Err()
		}
		return <-w.done
	}
}

// ackBatch is the deletes of one DeleteMessageBatch call.
type ackBatch struct {
	url     string
	entries []ackEntry
}

// ackSenders is how many DeleteMessageBatch calls an acker keeps in flight
// at most: one would bound a Worker with several receive loops to one
// delete round trip per 10 messages.
const ackSenders = 4

// acker buffers deletes per queue and sends them with DeleteMessageBatch when
// 10 are pending or interval after the first. It owns a timer goroutine and
// ackSenders sender goroutines, stopped by close.
type acker struct {
	client   *awssqs.Client
	interval time.Duration
	// visibility is the lease a delete whose lease may have ended asks for
	// while its receipt is checked ([Options.VisibilityTimeout]).
	visibility time.Duration
	log        *slog.Logger
	// wrap maps the error of a DeleteMessageBatch call to berth's sentinels
	// (what Broker.wrapDelete does).
	wrap func(ctx context.Context, what string, err error) error

	batches chan ackBatch
	arm     chan struct{} // cap 1: a partial batch is waiting for the timer
	kick    chan struct{} // cap 1: a batch was put back (requeue) while a Flush may wait
	stop    chan struct{} // closed by close: the timer stops
	stopped chan struct{} // closed by the timer when it has stopped
	quit    chan struct{} // closed by close after the last flush: the sender stops
	wg      sync.WaitGroup

	mu      sync.Mutex
	pending map[string][]ackEntry // by queue URL
	// gen is the generation of the deletes added now; each flush starts a
	// new one and waits for the deletes of the earlier ones only, not for
	// those other callers keep adding meanwhile.
	gen      uint64
	live     map[uint64]*ackGen // generations with deletes buffered or being sent
	surfaced []error
	dropped  int // failures beyond maxSurfaced since the last flush
	closed   bool
	// drained is set by close once its senders stopped and it took what was
	// left: a batch put back later (requeue) would wait for nobody.
	drained bool
	// abandoned counts the deletes finished with errClosedAcker: given up
	// on by close (buffered, or held by an Ack or Flush waiting for a
	// sender when close stopped the senders), never sent.
	abandoned int
}

// ackGen counts the deletes of one generation not finished yet; done is
// closed when the last one finishes.
type ackGen struct {
	n    int
	done chan struct{}
}

func newAcker(client *awssqs.Client, interval, visibility time.Duration, log *slog.Logger, wrap func(ctx context.Context, what string, err error) error) *acker {
	return startAcker(client, interval, visibility, log, wrap, ackSenders)
}

// startAcker is newAcker with senders sender goroutines (tests start none,
// to hold every batch as busy senders would).
func startAcker(client *awssqs.Client, interval, visibility time.Duration, log *slog.Logger, wrap func(ctx context.Context, what string, err error) error, senders int) *acker {
	a := &acker{
		client:     client,
		interval:   interval,
		visibility: visibility,
		log:        log,
		wrap:       wrap,
		batches:    make(chan ackBatch),
		arm:        make(chan struct{}, 1),
		kick:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		stopped:    make(chan struct{}),
		quit:       make(chan struct{}),
		pending:    make(map[string][]ackEntry),
		live:       make(map[uint64]*ackGen),
	}
	a.wg.Add(1 + senders)
	go a.timer()
	for range senders {
		go a.sender()
	}
	return a
}

// add buffers a delete. When it completes a batch of 10, add hands the batch
// to a sender, waiting while every sender is busy (backpressure) until ctx
// ends; then the batch stays buffered and the timer sends it.
func (a *acker) add(ctx context.Context, url string, e ackEntry) error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return errClosedAcker
	}
	e.gen = a.gen
	g := a.live[e.gen]
	if g == nil {
		g = &ackGen{done: make(chan struct{})}
		a.live[e.gen] = g
	}
	g.n++
	p := a.pending[url]
	if p == nil {
		// A batch's worth at once: appending from nil grew (and copied)
		// it four times a batch.
		p = make([]ackEntry, 0, batchSize)
	}
	p = append(p, e)
	var full []ackEntry
	if len(p) >= batchSize {
		full, p = p, nil
	}
	a.pending[url] = p
	first := len(p) == 1
	a.mu.Unlock()
	if full != nil {
		select {
		case a.batches <- ackBatch{url: url, entries: full}:
		case <-a.quit: // close gave up waiting for the sender
			a.finishAll(full, errClosedAcker)
		case <-ctx.Done(): // SQS is slow: do not hold the caller past its ctx
			a.requeue(ackBatch{url: url, entries: full})
		}
	} else if first {
		select {
		case a.arm <- struct{}{}:
		default:
		}
	}
	return nil
}

// errClosedAcker is the error of a delete that Close gave up on before it
// was sent: the message was not deleted. It wraps sdk.ErrClosed, as every
// call the broker's Close cuts off does, so that a SyncAck Ack or a
// DeadLetter waiting for it can tell it with errors.Is.
var errClosedAcker = fmt.Errorf("berth/sqs: the broker closed before the delete was sent: %w", sdk.ErrClosed)

// takeAll removes every partial batch from the buffer.
func (a *acker) takeAll() []ackBatch {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []ackBatch
	for url, p := range a.pending {
		if len(p) > 0 {
			out = append(out, ackBatch{url: url, entries: p})
		}
		delete(a.pending, url)
	}
	return out
}

// timer sends partial batches interval after one starts.
func (a *acker) timer() {
	defer a.wg.Done()
	defer close(a.stopped)
	t := time.NewTimer(a.interval)
	t.Stop()
	for {
		select {
		case <-a.stop:
			t.Stop()
			return
		case <-a.arm:
		}
		t.Reset(a.interval)
		select {
		case <-a.stop:
			t.Stop()
			return
		case <-t.C:
		}
		batches := a.takeAll()
		for i, b := range batches {
			select {
			case a.batches <- b:
			case <-a.stop: // close sends what is left itself
				for _, rest := range batches[i:] {
					a.requeue(rest)
				}
				return
			}
		}
	}
}

// requeue puts a batch back in the buffer and arms the timer, which sends
// it after the interval, and wakes a Flush waiting for the deletes (Close's
// included, whose timer has stopped), which sends it at once. Without the
// arm, a batch put back by a Flush whose ctx ended would wait for the next
// Ack, Flush or Close while its message came back and ran again; without
// the kick, a Flush or Close waiting while an Ack put its batch back would
// wait out its ctx (Close then dropped the deletes).
func (a *acker) requeue(b ackBatch) {
	a.mu.Lock()
	if a.drained { // nobody sends it any more: the message was not deleted
		a.mu.Unlock()
		a.finishAll(b.entries, errClosedAcker)
		return
	}
	a.pending[b.url] = append(a.pending[b.url], b.entries...)
	a.mu.Unlock()
	select {
	case a.arm <- struct{}{}:
	default:
	}
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// sender sends batches until quit.
func (a *acker) sender() {
	defer a.wg.Done()
	for {
		select {
		case <-a.quit:
			return
		case b := <-a.batches:
			// A batch put back in the buffer (requeue) joins the deletes
			// buffered meanwhile and may exceed SQS's 10 entries per call.
			for len(b.entries) > 0 {
				n := min(len(b.entries), batchSize)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				a.deleteBatch(ctx, ackBatch{url: b.url, entries: b.entries[:n]})
				cancel()
				b.entries = b.entries[n:]
			}
		}
	}
}

// leaseMargin is how long before its lease ends (by the delivery's count)
// a delete is checked first (confirm). The delivery's count already starts
// before its ReceiveMessage call, so it ends before SQS's; the margin covers
// the delete's way to SQS after the decision, and the confirm calls of
// other entries made before it (one round trip), which take well under
// 250 ms even across regions.
const leaseMargin = 250 * time.Millisecond

// confirm checks the receipts of the entries whose lease has ended or ends
// within leaseMargin, with one ChangeMessageVisibilityBatch call that keeps
// them hidden for the broker's visibility timeout while their delete
// follows, and returns the entries to delete now and those to check again
// (SQS failed on its side). A delete sent with a receipt whose message was
// received again since succeeds but deletes nothing: the message would run
// again while Ack and Flush reported success. An entry whose receipt is
// stale is finished with an error wrapping [sdk.ErrLeaseLost]; one whose
// check failed otherwise is finished with that error, as a failed delete
// is, and not deleted: a delete that cannot be confirmed may delete
// nothing, and its message comes back, as after any failed delete. Entries
// whose lease is not near its end are returned as they are, with no call.
func (a *acker) confirm(ctx context.Context, url string, entries []ackEntry) (send, again []ackEntry) {
	now := time.Now()
	var check []int // indices in entries
	var secs []int32
	for i, e := range entries {
		if now.Before(e.deadline.Add(-leaseMargin)) {
			send = append(send, e)
			continue
		}
		// SQS refuses a visibility ending more than 12 hours after the
		// receipt; the lease ended, or ends within a second, by then.
		s := ceilSeconds(a.visibility)
		if left := e.received.Add(MaxVisibility).Sub(now); left < time.Duration(s)*time.Second {
			s = int32(left / time.Second)
		}
		if s < 1 {
			a.finish(e, leaseLost(e.id, &LeaseCeilingError{ID: e.id, Requested: a.visibility, Received: e.received}))
			continue
		}
		check = append(check, i)
		secs = append(secs, s)
	}
	if len(check) == 0 {
		return send, nil
	}
	in := &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(url), Entries: make([]sqstypes.ChangeMessageVisibilityBatchRequestEntry, len(check))}
	for j, i := range check {
		in.Entries[j] = sqstypes.ChangeMessageVisibilityBatchRequestEntry{
			Id: aws.String(strconv.Itoa(j)), ReceiptHandle: aws.String(entries[i].handle), VisibilityTimeout: secs[j],
		}
	}
	out, err := a.client.ChangeMessageVisibilityBatch(ctx, in, withBody)
	if err != nil { // the SDK already retried what it could
		err = a.wrap(ctx, "check the leases of deletes from "+entries[check[0]].queue, err)
		for _, i := range check {
			a.finish(entries[i], err)
		}
		return send, nil
	}
	answered := make([]bool, len(check))
	for _, s := range out.Successful {
		if j, err := strconv.Atoi(aws.ToString(s.Id)); err == nil && j >= 0 && j < len(check) && !answered[j] {
			answered[j] = true
			e := entries[check[j]]
			e.deadline = now.Add(time.Duration(secs[j]) * time.Second) // no check again on a retry
			send = append(send, e)
		}
	}
	for _, f := range out.Failed {
		j, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || j < 0 || j >= len(check) || answered[j] {
			continue
		}
		answered[j] = true
		e := entries[check[j]]
		var ferr error = &EntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
		switch {
		case staleCode(aws.ToString(f.Code)):
			a.finish(e, leaseLost(e.id, ferr))
		case !f.SenderFault && e.tries < entryRetries:
			e.tries++
			again = append(again, e)
		default:
			a.finish(e, ferr)
		}
	}
	for j, ok := range answered {
		if !ok {
			a.finish(entries[check[j]], unanswered("the lease check of this delete"))
		}
	}
	return send, again
}

// deleteBatch sends one DeleteMessageBatch, retries the entries that failed
// on SQS's side, and delivers every entry's result. Entries whose lease
// may have ended are checked first (confirm).
func (a *acker) deleteBatch(ctx context.Context, b ackBatch) {
	entries := b.entries
	for len(entries) > 0 {
		send, again := a.confirm(ctx, b.url, entries)
		if len(send) > 0 {
			again = a.deleteOnce(ctx, b.url, send, again)
		}
		if len(again) > 0 {
			select {
			case <-ctx.Done():
				for _, e := range again {
					a.finish(e, ctx.Err())
				}
				return
			case <-time.After(time.Duration(again[0].tries) * 50 * time.Millisecond):
			}
		}
		entries = again
	}
}

// deleteOnce sends one DeleteMessageBatch of entries and delivers their
// results, but for those that failed on SQS's side, which it appends to
// again and returns.
func (a *acker) deleteOnce(ctx context.Context, url string, entries, again []ackEntry) []ackEntry {
	in := &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: make([]sqstypes.DeleteMessageBatchRequestEntry, len(entries))}
	for i, e := range entries {
		in.Entries[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(e.handle)}
	}
	var sent lastAttempt
	out, err := a.client.DeleteMessageBatch(ctx, in, sent.option(), withBody)
	if err != nil { // the SDK already retried what it could
		err = a.wrap(ctx, "delete from "+entries[0].queue, err)
		for _, e := range entries {
			a.finish(e, err)
		}
		return again
	}
	answered := make([]bool, len(entries))
	for _, s := range out.Successful {
		if i, err := strconv.Atoi(aws.ToString(s.Id)); err == nil && i >= 0 && i < len(entries) && !answered[i] {
			answered[i] = true
			if e := entries[i]; sent.late(e.deadline) {
				// SQS answers success to a stale receipt and deletes
				// nothing: this success says nothing.
				a.finish(e, fmt.Errorf("berth/sqs: the delete was sent again (the SDK retried it) when its lease may have ended: %w", sdk.ErrUnavailable))
			} else {
				a.finish(e, nil)
			}
		}
	}
	for _, f := range out.Failed {
		i, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || i < 0 || i >= len(entries) || answered[i] {
			continue
		}
		answered[i] = true
		e := entries[i]
		var ferr error = &EntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
		if staleCode(aws.ToString(f.Code)) {
			// The receipt handle no longer holds the message (its
			// visibility ran out): sending it again cannot help.
			a.finish(e, leaseLost(e.id, ferr))
			continue
		}
		if !f.SenderFault && e.tries < entryRetries {
			e.tries++
			again = append(again, e)
			continue
		}
		a.finish(e, ferr)
	}
	for i, ok := range answered {
		if !ok {
			a.finish(entries[i], unanswered("this delete"))
		}
	}
	return again
}

// lastAttempt is what lastAttempt.option saw of a call's attempts (the
// SDK's retries make several): how many, and when the last one started.
type lastAttempt struct {
	n     int
	start time.Time
}

// option is a call option that notes the call's attempts in l. The retry
// loop runs its attempts one after another on the calling goroutine.
func (l *lastAttempt) option() func(*awssqs.Options) {
	return awssqs.WithAPIOptions(func(s *middleware.Stack) error {
		mw := middleware.FinalizeMiddlewareFunc("berthLastAttempt",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				l.n++
				l.start = time.Now()
				return next.HandleFinalize(ctx, in)
			})
		// Right inside the SDK's retry loop: once an attempt, also one
		// that a client middleware further in ends.
		if err := s.Finalize.Insert(mw, "Retry", middleware.After); err == nil {
			return nil
		}
		return s.Finalize.Add(mw, middleware.After)
	})
}

// late reports whether the call's answer may concern a receipt whose lease,
// ending at deadline, had run out: the SDK retried it, and its last attempt
// started within leaseMargin of deadline or after. confirm checks a delete
// before its call, when the call's first attempt follows at once; a retry
// may come after a backoff, and SQS answers success to a delete whose
// receipt no longer holds the message and deletes nothing.
func (l *lastAttempt) late(deadline time.Time) bool {
	return l.n > 1 && !l.start.Before(deadline.Add(-leaseMargin))
}

// finish delivers the result of one delete.
func (a *acker) finish(e ackEntry, err error) {
	closedAcker := err == errClosedAcker
	if err != nil {
		err = &AckError{Queue: e.queue, ID: e.id, Err: err}
	}
	answer := e.w != nil && e.w.state.CompareAndSwap(waiterWaiting, waiterAnswered)
	a.mu.Lock()
	if closedAcker {
		a.abandoned++
	}
	if !answer && err != nil { // nobody waits, or the waiter gave up
		msg := "berth/sqs: delete failed; the message will be delivered again"
		if errors.Is(err, sdk.ErrUnavailable) { // SQS's answer was lost or left it out
			msg = "berth/sqs: delete's outcome unknown; the message may be delivered again"
		}
		a.log.Warn(msg, slog.String("queue", e.queue), sdk.LogText("message_id", e.id), sdk.LogCause("error", err)) // the ID is the producer's
		if len(a.surfaced) < maxSurfaced {
			a.surfaced = append(a.surfaced, err)
		} else {
			a.dropped++
		}
	}
	if g := a.live[e.gen]; g != nil {
		if g.n--; g.n == 0 {
			close(g.done)
			delete(a.live, e.gen)
		}
	}
	a.mu.Unlock()
	if answer {
		e.w.done <- err
	}
}

// finishAll delivers err as the result of every delete of entries.
func (a *acker) finishAll(entries []ackEntry, err error) {
	for _, e := range entries {
		a.finish(e, err)
	}
}

// flush sends every partial batch and waits until the deletes added before
// it began are sent (those added meanwhile are not waited for: under a
// steady stream of acks from other callers the acker is never idle), then
// returns the failures since the last flush. A batch put back meanwhile by
// an Ack whose ctx ended (requeue) is sent when it is put back. A flush
// still handing batches over when close stops the senders finishes their
// deletes with errClosedAcker and returns sdk.ErrClosed.
func (a *acker) flush(ctx context.Context) error {
	a.mu.Lock()
	waits := make([]chan struct{}, 0, len(a.live))
	for _, g := range a.live { // every generation so far
		waits = append(waits, g.done)
	}
	a.gen++
	a.mu.Unlock()
	for send := true; ; {
		if send {
			batches := a.takeAll()
			for i, b := range batches {
				select {
				case a.batches <- b:
				case <-a.quit: // close gave up waiting for the senders, which stopped
					for _, rest := range batches[i:] {
						a.finishAll(rest.entries, errClosedAcker)
					}
					return sdk.ErrClosed
				case <-ctx.Done():
					for _, rest := range batches[i:] {
						a.requeue(rest)
					}
					return ctx.Err()
				}
			}
			send = false
		}
		if len(waits) == 0 {
			break
		}
		select {
		case <-waits[0]:
			waits = waits[1:]
		case <-a.kick: // a batch was put back in the buffer: send it too
			send = true
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	errs := a.surfaced
	if a.dropped > 0 {
		errs = append(errs, errors.New("berth/sqs: "+strconv.Itoa(a.dropped)+" more deletes failed (see the logs)"))
	}
	a.surfaced, a.dropped = nil, 0
	return errors.Join(errs...)
}

// close refuses new deletes, flushes what is buffered and stops the
// goroutines.
func (a *acker) close(ctx context.Context) error {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	close(a.stop)
	// The timer may be handing a batch to the sender and put it back when
	// it sees stop: flush only once it has, or flush would miss that batch
	// and wait for it until ctx ends.
	<-a.stopped
	err := a.flush(ctx)
	close(a.quit)
	a.wg.Wait()
	a.mu.Lock()
	a.drained = true // a batch put back from now on is finished by requeue
	// The senders have stopped: no delete is in flight. Every delete not
	// yet finished is buffered or held by an Ack or Flush that will finish
	// it with errClosedAcker; those already finished so are counted.
	unsent := a.abandoned
	for _, g := range a.live {
		unsent += g.n
	}
	a.mu.Unlock()
	for _, b := range a.takeAll() { // left over when ctx ran out
		a.finishAll(b.entries, errClosedAcker)
	}
	// flush returns ctx.Err() itself when it gives up; an error it returns
	// otherwise (the deletes that failed, an AckError of a delete call that
	// timed out among them) is not Close giving up, even if ctx ended since.
	if err != nil && err == ctx.Err() {
		// Said in Close's error, not only in the log: a bare deadline
		// error names neither what Close gave up on nor what follows.
		err = fmt.Errorf("berth/sqs: close gave up waiting for the deletes being sent (%d buffered deletes not sent: their messages come back after the visibility timeout): %w", unsent, err)
	}
	return err
}
