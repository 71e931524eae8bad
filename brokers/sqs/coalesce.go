package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/berthq/berth/sdk"
)

// DefaultPublishSenders is the default [Options.PublishSenders].
const DefaultPublishSenders = 16

// coalescer lets concurrent Publish calls of a few messages each to a
// standard queue share SendMessageBatch calls (group commit): at most
// Options.PublishSenders such calls are in flight. A Publish that finds a
// sender free sends at once, with whatever of its queue is waiting (up to
// 10); one that finds them all busy queues its entries, and the next sender
// free takes up to 10 of them.
//
// Under load, Nagle's rule: while a full call (10 entries) of a queue is in
// flight, at most one call of fewer than 10 entries may be too. Entries that
// arrive then queue up; as soon as 10 are queued a sender takes them, and
// the rest go in one call when the partial call returns. Busy producers so
// fill their calls — fewer requests (SQS bills each) and, where the server
// is the bottleneck, more messages a second — and a message waits at most
// one call's round trip longer. Without a full call in flight (a few
// concurrent callers) partial calls go in parallel as before: serialising
// them would halve the throughput of, say, 4 callers on a network where a
// round trip, not the server, is the cost.
type coalescer struct {
	closing context.Context // done when the broker closes
	sem     chan struct{}   // a token per call in flight

	mu      sync.Mutex
	pending map[string][]*shared     // by queue URL, oldest first
	partial map[string]chan struct{} // by queue URL: a token held by the queue's partial call under load
	fulls   map[string]int           // by queue URL: full calls in flight

	senders senderPool // the goroutines the calls run on
}

// shared is one entry waiting in the coalescer, and the Publish it belongs to.
type shared struct {
	e sendEntry
	w *waiter
}

// waiter is one Publish call's share: its entries' outcomes.
type waiter struct {
	ctx  context.Context
	done chan struct{} // closed when every entry has an outcome

	mu      sync.Mutex
	left    int
	failed  map[string]error // entries not published, by message ID
	callErr error            // the first error of a call that carried its entries ([uncertain] ones first)
	sent    bool             // some entry was published
}

func newCoalescer(senders int, closing context.Context) *coalescer {
	return &coalescer{closing: closing, sem: make(chan struct{}, senders), pending: map[string][]*shared{}, partial: map[string]chan struct{}{}, fulls: map[string]int{}}
}

// settle records the outcome of entry id: err nil (published), the error of
// the call that carried it (call true) or SQS's refusal of the entry.
func (w *waiter) settle(id string, err error, call bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		w.sent = true
	} else {
		if w.failed == nil {
			w.failed = map[string]error{}
		}
		w.failed[id] = err
		// A call cut short or whose answer was lost (its entries perhaps
		// published) has its error returned rather than another call's
		// refusal, which would say that nothing was published.
		if call && (w.callErr == nil || !uncertain(w.callErr) && uncertain(err)) {
			w.callErr = err
		}
	}
	w.left--
	if w.left == 0 {
		close(w.done)
	}
}

// result is what the Publish returns: a call's error itself when every
// entry failed with calls' errors (nothing was published, unless that error
// says it may have been), else a PublishError naming the entries not
// published, else nil.
func (w *waiter) result() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.failed) == 0 {
		return nil
	}
	if !w.sent && w.callErr != nil {
		allCalls := true
		for _, err := range w.failed {
			// An entry SQS refused, or one its answer left unaccounted
			// for (perhaps published) when the call's error says that
			// nothing was: each is named with its own error.
			var refused *EntryError
			if errors.As(err, &refused) || uncertain(err) && !uncertain(w.callErr) {
				allCalls = false
				break
			}
		}
		if allCalls {
			return w.callErr
		}
	}
	return &sdk.PublishError{Failed: w.failed}
}

// publishShared publishes entries (one chunk's worth, to a standard queue)
// through the coalescer and waits for their outcomes. It stops waiting when
// ctx ends or the broker closes; ctx is the caller's, not one derived with
// Broker.watch: every Publish registering with the broker's one closing
// context would serialise concurrent publishers on its lock, and costs
// allocations a message.
func (b *Broker) publishShared(ctx context.Context, q *queueRef, entries []sendEntry) error {
	c := b.co
	closing := c.closing.Done()
	w := &waiter{ctx: ctx, done: make(chan struct{}), left: len(entries)}
	c.mu.Lock()
	for _, e := range entries {
		c.pending[q.url] = append(c.pending[q.url], &shared{e: e, w: w})
	}
	c.mu.Unlock()
	for {
		select {
		case <-w.done:
			return w.result()
		default:
		}
		// Under load (a full call in flight) a call of fewer than 10
		// entries needs the queue's partial token.
		var tok chan struct{}
		need := anyBatch
		switch full, loaded, t := c.fill(q.url, b.opts.MaxWireSize); {
		case full:
			need = fullBatch
		case loaded:
			select {
			case t <- struct{}{}:
				tok = t
			case <-w.done:
				return w.result()
			case <-ctx.Done():
				c.withdraw(q.url, w, c.cut(ctx))
				return c.cut(ctx)
			case <-closing:
				c.withdraw(q.url, w, c.cut(ctx))
				return c.cut(ctx)
			}
		}
		select {
		case c.sem <- struct{}{}:
			batch, isFull, ok := c.take(q.url, b.opts.MaxWireSize, need)
			if !ok { // no longer a full call's worth: look again
				<-c.sem
				continue
			}
			release := func() { // the tokens of the call, once it returned
				if isFull {
					c.mu.Lock()
					c.fulls[q.url]--
					c.mu.Unlock()
				}
				<-c.sem
				if tok != nil {
					<-tok
				}
			}
			if len(batch) == 0 { // others took ours: they are being sent
				release()
				select {
				case <-w.done:
					return w.result()
				case <-ctx.Done():
					return c.cut(ctx) // they may be published, as with a Publish cut short
				case <-closing:
					return c.cut(ctx)
				}
			}
			// The call may carry other Publish calls' entries, and goes on
			// while any of them waits: this one stops waiting when its ctx
			// ends (or the broker closes), and the call then releases its
			// tokens itself.
			h := &handoff{}
			call := c.senders.start(func() { b.sendHandedOff(q, batch, h, release) })
			select {
			case <-call.done:
			case <-ctx.Done():
				if h.leave() {
					// Its entries still queued are withdrawn; those in
					// the call may be published.
					c.withdraw(q.url, w, c.cut(ctx))
					return c.cut(ctx)
				}
				<-call.done // the call ended meanwhile
			case <-closing:
				if h.leave() {
					c.withdraw(q.url, w, c.cut(ctx))
					return c.cut(ctx)
				}
				<-call.done
			}
			if call.panicked || call.exited {
				// This Publish panics (or exits) with entries of its own
				// maybe still queued, when the batch was others': a later
				// Publish would send them, long after this one ended.
				// Withdrawn before the tokens go, which would let another
				// take them. The tokens go all the same: the broker keeps
				// its senders.
				c.withdraw(q.url, w, fmt.Errorf("berth/sqs: publish to %s: the Publish panicked", q.name))
			}
			release()
			call.raise() // the call's panic, here where it can be recovered
		case <-w.done:
			if tok != nil {
				<-tok
			}
			return w.result()
		case <-ctx.Done():
			if tok != nil {
				<-tok
			}
			// Entries still queued are withdrawn (not sent); those already
			// in a call may be published, as with a Publish cut short.
			c.withdraw(q.url, w, c.cut(ctx))
			return c.cut(ctx)
		case <-closing:
			if tok != nil {
				<-tok
			}
			c.withdraw(q.url, w, c.cut(ctx))
			return c.cut(ctx)
		}
	}
}

// handoff says who releases the tokens of a shared call: the Publish that
// sent it, once the call returned, or the call itself when that Publish
// stopped waiting first (its ctx ended, or the broker closed).
type handoff struct {
	mu    sync.Mutex
	ended bool // the call returned (or panicked, or exited)
	left  bool // the Publish stopped waiting
}

// leave is called by the Publish that stops waiting for its call: true
// when the call is still under way, which then releases its tokens; false
// when it has ended, and the Publish goes on as if it had waited.
func (h *handoff) leave() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.left = !h.ended
	return h.left
}

// end is called by the call once it ended: it reports whether the Publish
// that sent it has left.
func (h *handoff) end() (left bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended = true
	return h.left
}

// sendHandedOff runs sendShared for batch on a sender. When the Publish
// that sent it has stopped waiting (h), the call releases the tokens
// itself (release), and logs a panic of its, which no caller is left to
// raise; otherwise the panic goes on to that Publish (senderPool.start).
func (b *Broker) sendHandedOff(q *queueRef, batch []*shared, h *handoff, release func()) {
	var end abend
	defer func() {
		if h.end() {
			if end.panicked {
				b.opts.Logger.Error("berth/sqs: a shared SendMessageBatch call panicked after its Publish stopped waiting",
					slog.String("queue", q.name), slog.String("panic", fmt.Sprint(end.p)))
			}
			release()
		}
	}()
	guard(&end, func() { b.sendShared(q, batch) })
	end.raise() // recovered by the sender: its caller raises it again, when it waits
}

// What a sender may take: anything queued, or only a full call's worth.
const (
	anyBatch  = false
	fullBatch = true
)

// cut is the error of a Publish, or of an entry dropped, that stopped
// waiting: sdk.ErrClosed when the broker closed, else ctx's error.
func (c *coalescer) cut(ctx context.Context) error {
	if c.closing.Err() != nil {
		return sdk.ErrClosed
	}
	return ctx.Err()
}

// fill reports whether the entries queued for url fill a call and whether
// a full call of url is in flight, and returns url's partial-call token.
func (c *coalescer) fill(url string, maxWire int) (full, loaded bool, tok chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.partial[url]
	if t == nil {
		t = make(chan struct{}, 1)
		c.partial[url] = t
	}
	return c.fullLocked(url, maxWire), c.fulls[url] > 0, t
}

// fullLocked reports whether the entries queued for url fill a call: 10 of
// them, or more than maxWire bytes. c.mu is held.
func (c *coalescer) fullLocked(url string, maxWire int) bool {
	p := c.pending[url]
	if len(p) >= batchSize {
		return true
	}
	size := 0
	for _, s := range p {
		size += s.e.enc.size
	}
	return size > maxWire
}

// take removes up to batchSize entries of queue url, at most maxWire bytes,
// oldest first, and reports whether they fill a call (then counted in flight
// until the caller's send returns). Entries whose Publish gave up are
// dropped. With onlyFull set it takes nothing, and reports ok false, unless
// the entries fill a call.
func (c *coalescer) take(url string, maxWire int, onlyFull bool) (batch []*shared, full, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if onlyFull && !c.fullLocked(url, maxWire) {
		return nil, false, false
	}
	p := c.pending[url]
	size, i := 0, 0
	for ; i < len(p) && len(batch) < batchSize; i++ {
		s := p[i]
		if s.w.ctx.Err() != nil {
			s.w.settle(s.e.id, c.cut(s.w.ctx), true)
			continue
		}
		if size+s.e.enc.size > maxWire {
			full = true // the next one does not fit: as full as a call gets
			break
		}
		size += s.e.enc.size
		batch = append(batch, s)
	}
	if rest := p[i:]; len(rest) > 0 {
		c.pending[url] = rest
	} else {
		delete(c.pending, url)
	}
	full = full || len(batch) == batchSize
	if full {
		c.fulls[url]++
	}
	return batch, full, true
}

// withdraw removes w's entries still queued for url, settling them with
// err.
func (c *coalescer) withdraw(url string, w *waiter, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pending[url]
	kept := p[:0]
	for _, s := range p {
		if s.w == w {
			s.w.settle(s.e.id, err, true)
			continue
		}
		kept = append(kept, s)
	}
	clear(p[len(kept):])
	if len(kept) > 0 {
		c.pending[url] = kept
	} else {
		delete(c.pending, url)
	}
}

// sendShared sends batch in one SendMessageBatch call and settles every
// entry. The call ends when the broker closes or when every Publish of the
// batch has given up; it keeps the values (tracing) of the first one's ctx.
func (b *Broker) sendShared(q *queueRef, batch []*shared) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].w.ctx))
	defer cancel()
	defer context.AfterFunc(b.closing, cancel)()
	var waiters []*waiter
	for _, s := range batch {
		if !slices.Contains(waiters, s.w) {
			waiters = append(waiters, s.w)
		}
	}
	var left atomic.Int64
	left.Store(int64(len(waiters)))
	for _, w := range waiters {
		defer context.AfterFunc(w.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})()
	}
	chunk := make([]sendEntry, len(batch))
	for i, s := range batch {
		chunk[i] = s.e
	}
	// A panic in the call (a client middleware's) reaches the Publish that
	// sent it (senderPool.run); the other Publish calls of the batch get
	// an error rather than wait for outcomes that never come.
	returned := false
	defer func() {
		if !returned {
			// It may have panicked once SQS had taken the messages.
			err := fmt.Errorf("berth/sqs: publish to %s: the SendMessageBatch call panicked: %w", q.name, sdk.ErrUnavailable)
			for _, s := range batch {
				s.w.settle(s.e.id, err, true)
			}
		}
	}()
	// Outcomes go by entry: two Publish calls of the batch may carry the
	// same message ID, and one's refusal is not the other's.
	refused, err := b.sendBatch(ctx, q, chunk)
	returned = true
	for i, s := range batch {
		if err != nil {
			s.w.settle(s.e.id, err, true)
		} else {
			s.w.settle(s.e.id, refused[i], false)
		}
	}
}
