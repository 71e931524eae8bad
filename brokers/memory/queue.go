package memory

import (
	"bytes"
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/berthq/berth/sdk"
)

// Where an entry is.
const (
	stateReady = iota
	stateDelayed
	stateInFlight
	stateGone // acked, dead-lettered, or dropped at Close
)

// entry is one message in a queue, from publish to ack or dead letter. Its
// msg never changes after publish: deliveries hand out &e.msg without copying,
// and dead letters and redrives work on clones.
type entry struct {
	msg sdk.Message
	gen uint64    // bumped at every delivery and settlement: fences stale deliveries
	due time.Time // stateDelayed: when it becomes ready; stateInFlight: lease end
	// readySince is, in stateReady, when it became ready, on the monotonic
	// clock (sinceEpoch); in stateDelayed, the order it was scheduled in
	// (queue.scheduled), which breaks ties of due in the delayed heap.
	readySince int64
	failed     *failure // set by the first Retry or DeadLetter
	attempts   int32    // deliveries so far (Release gives one back)
	state      int32    // stateReady, ...
	index      int32    // position in the delayed or in-flight heap
	// shared: the entry is in its Publish batch's array of entries and its
	// body in the batch's array of bodies (one allocation each for the
	// batch), which stay in memory as long as any entry of the batch does.
	// An entry that may stay long after the rest of its batch — a Retry, a
	// Release, a Delay in a batch of several — is moved out first (detached,
	// store), so that one straggler does not keep a whole batch, acked long
	// ago, in memory. Never changes once the entry is stored.
	shared bool
}

// detached returns a copy of e's message in an entry of its own, with a
// body of its own, for a shared entry about to be kept apart from its
// batch (Retry, Release); nil when e is not shared. e.msg and e.shared
// never change once stored, so q.mu need not be held: the copy is made
// before the settlement takes the lock.
func (e *entry) detached() *entry {
	if !e.shared {
		return nil
	}
	own := &entry{msg: e.msg}
	own.msg.Body = bytes.Clone(e.msg.Body)
	return own
}

// failure is what an entry keeps of its failures, for the dead-letter
// headers: apart from the entry, which every message pays for, as few fail.
type failure struct {
	first     time.Time // first Retry or DeadLetter
	lastError string    // the cause of the last Retry, kept in a poison dead letter's reason
}

// epoch anchors sinceEpoch.
var epoch = time.Now()

// sinceEpoch is t on the monotonic clock, as nanoseconds since epoch: an
// entry's ready time in 8 bytes instead of a time.Time's 24.
func sinceEpoch(t time.Time) int64 { return int64(t.Sub(epoch)) }

// queue is one named queue. Every field is guarded by mu.
type queue struct {
	name     string
	mu       sync.Mutex
	ready    fifo
	delayed  dueHeap  // by due, then in the order scheduled
	inFlight timeHeap // by lease end
	// scheduled counts the entries put in the delayed heap: the order of
	// entries with the same due (a batch published with one Delay).
	scheduled int64
	dead      []*sdk.Message
	deadSeq   map[*sdk.Message]uint64 // position of each dead letter, for DeadLetterPage cursors
	deadNext  uint64
	deadPeak  int // the most letters dead and deadSeq held since they were made (releaseDead)

	// wake is closed (and set to nil) when a waiting receiver must look
	// again: ready work arrived or the next deadline moved earlier.
	wake      chan struct{}
	wakeAt    time.Time // the deadline the waiters' timers are set for; zero: none
	hasWakeAt bool

	// waiters are the Publish calls waiting for room in the backlog
	// (Options.MaxBacklog), oldest first: admit stores them in that order,
	// and a Publish never goes in ahead of one waiting before it.
	waiters []*waiter
}

// waiter is a Publish waiting for room in its queue's backlog.
type waiter struct {
	ctx     context.Context
	entries []entry
	in      chan struct{} // closed when admit stored the entries
	stored  bool
}

// backlog is the number of messages waiting for a receiver: ready or delayed.
func (q *queue) backlog() int { return q.ready.len() + len(q.delayed) }

// fits reports whether n more messages fit in the backlog bound limit (0:
// no bound). More than limit fit once the backlog is empty.
func (q *queue) fits(limit, n int) bool {
	if limit <= 0 {
		return true
	}
	if n > limit {
		return q.backlog() == 0
	}
	return q.backlog()+n <= limit
}

// admit stores the batches of the waiting Publish calls, oldest first,
// while the oldest fits, at now (q is promoted to now). A waiter whose
// context ended is passed over: its Publish stores nothing.
func (q *queue) admit(limit int, now time.Time) {
	for len(q.waiters) > 0 {
		w := q.waiters[0]
		if w.ctx.Err() == nil {
			if !q.fits(limit, len(w.entries)) {
				return
			}
			q.store(w.entries, now)
			w.stored = true
			close(w.in)
		}
		q.waiters[0] = nil
		q.waiters = q.waiters[1:]
	}
	q.waiters = nil // let the array go
}

// store makes entries ready, or schedules those with a Delay, at now.
func (q *queue) store(entries []entry, now time.Time) {
	for i := range entries {
		e := &entries[i]
		if d := e.msg.Delay; d > 0 {
			e.msg.Delay = 0
			if e.shared { // it waits out its delay apart from its batch (Publish gave it its own body)
				own := new(entry)
				*own = *e
				own.shared = false
				e = own
			}
			q.schedule(e, now.Add(d))
			continue
		}
		e.msg.Delay = 0
		q.makeReady(e, now)
	}
}

// signal wakes the waiting receivers.
func (q *queue) signal() {
	if q.wake != nil {
		close(q.wake)
		q.wake = nil
	}
}

// deadlineMoved wakes waiting receivers if t is earlier than what they wait for.
func (q *queue) deadlineMoved(t time.Time) {
	if q.wake != nil && (!q.hasWakeAt || t.Before(q.wakeAt)) {
		q.signal()
	}
}

// makeReady appends e to the ready FIFO.
func (q *queue) makeReady(e *entry, now time.Time) {
	e.state = stateReady
	e.readySince = sinceEpoch(now)
	q.ready.push(e)
	q.signal()
}

// schedule puts e in the delayed heap until due.
func (q *queue) schedule(e *entry, due time.Time) {
	e.state = stateDelayed
	e.due = due
	q.scheduled++
	e.readySince = q.scheduled
	heap.Push(&q.delayed, e)
	if q.delayed[0] == e {
		q.deadlineMoved(due)
	}
}

// promote moves due delayed entries to ready and returns expired leases to
// ready (their attempt stays counted). Entries over the delivery cap go to
// the dead-letter queue.
//
// The two heaps are merged in due order, and every makeReady at now is
// preceded by a promote at now, so the ready FIFO stays ordered by
// readySince: its head is the oldest ready message, which Stats reports.
func (q *queue) promote(now time.Time, maxDeliveries int) {
	for {
		delayedDue := len(q.delayed) > 0 && !q.delayed[0].due.After(now)
		leaseDue := len(q.inFlight) > 0 && !q.inFlight[0].due.After(now)
		switch {
		case delayedDue && (!leaseDue || !q.inFlight[0].due.Before(q.delayed[0].due)):
			e := heap.Pop(&q.delayed).(*entry)
			q.makeReady(e, e.due)
		case leaseDue:
			e := heap.Pop(&q.inFlight).(*entry)
			e.gen++ // the holder's lease is lost
			if maxDeliveries > 0 && int(e.attempts) >= maxDeliveries {
				q.deadLetter(e, e.poison(), now)
				continue
			}
			q.makeReady(e, e.due)
		default:
			return
		}
	}
}

// nextDeadline returns the earliest time something becomes ready.
func (q *queue) nextDeadline() (time.Time, bool) {
	var t time.Time
	ok := false
	if len(q.delayed) > 0 {
		t, ok = q.delayed[0].due, true
	}
	if len(q.inFlight) > 0 && (!ok || q.inFlight[0].due.Before(t)) {
		t, ok = q.inFlight[0].due, true
	}
	return t, ok
}

// poison is the cause of e's dead-lettering by the delivery cap: the last
// Retry's cause stays in the reason, so the real error is not lost.
func (e *entry) poison() error {
	if e.failed == nil || e.failed.lastError == "" {
		return sdk.ErrMaxDeliveries
	}
	return fmt.Errorf("%w; last error: %s", sdk.ErrMaxDeliveries, e.failed.lastError)
}

// deadLetter moves e (already out of every list) to the dead-letter queue.
func (q *queue) deadLetter(e *entry, cause error, now time.Time) {
	e.state = stateGone
	e.gen++
	m := e.msg.Clone()
	m.Delay = 0
	var first time.Time
	if e.failed != nil {
		first = e.failed.first
	}
	sdk.AnnotateDeadLetter(m, q.name, int(e.attempts), cause, first, now)
	q.dead = append(q.dead, m)
	q.numberDead(m)
}

// The ready FIFO and the heaps let a burst's array go once it is under a
// shrinkRatio-th full and above shrinkAbove entries: a queue that does not
// empty after a burst would otherwise keep its arrays for its whole life.
// The copies cost under a tenth of a pointer copied per message of the burst.
const (
	shrinkAbove = 4096
	shrinkRatio = 16
)

// fifo is a growable ring buffer of entries.
type fifo struct {
	buf        []*entry
	head, size int
}

func (f *fifo) len() int { return f.size }

func (f *fifo) push(e *entry) {
	if f.size == len(f.buf) {
		n := max(2*len(f.buf), 64)
		buf := make([]*entry, n)
		k := copy(buf, f.buf[f.head:])
		copy(buf[k:], f.buf[:f.head])
		f.buf, f.head = buf, 0
	}
	f.buf[(f.head+f.size)%len(f.buf)] = e
	f.size++
}

func (f *fifo) peek() *entry { return f.buf[f.head] }

func (f *fifo) pop() *entry {
	e := f.buf[f.head]
	f.buf[f.head] = nil
	f.head = (f.head + 1) % len(f.buf)
	f.size--
	if f.size == 0 {
		f.head = 0
	}
	if len(f.buf) > shrinkAbove && f.size < len(f.buf)/shrinkRatio { // let a burst's buffer go
		f.shrink()
	}
	return e
}

// shrink moves the entries to a buffer of twice their number (none when
// empty), keeping their order.
func (f *fifo) shrink() {
	if f.size == 0 {
		f.buf, f.head = nil, 0
		return
	}
	buf := make([]*entry, 2*f.size)
	for i := range f.size {
		buf[i] = f.buf[(f.head+i)%len(f.buf)]
	}
	f.buf, f.head = buf, 0
}

// dueHeap is the delayed heap: a timeHeap whose entries with the same due
// (a batch published with one Delay) come out in the order they were
// scheduled, kept in readySince while they wait, so that they become ready
// in publish order. The in-flight heap needs no such order, and its Less,
// run at every Receive and Ack, stays one comparison.
type dueHeap []*entry

func (h dueHeap) Len() int { return len(h) }
func (h dueHeap) Less(i, j int) bool {
	if c := h[i].due.Compare(h[j].due); c != 0 {
		return c < 0
	}
	return h[i].readySince < h[j].readySince
}
func (h dueHeap) Swap(i, j int) { timeHeap(h).Swap(i, j) }
func (h *dueHeap) Push(x any)   { (*timeHeap)(h).Push(x) }
func (h *dueHeap) Pop() any     { return (*timeHeap)(h).Pop() }

// timeHeap is a min-heap of entries by due, for container/heap.
type timeHeap []*entry

func (h timeHeap) Len() int           { return len(h) }
func (h timeHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h timeHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = int32(i)
	h[j].index = int32(j)
}
func (h *timeHeap) Push(x any) {
	e := x.(*entry)
	e.index = int32(len(*h))
	*h = append(*h, e)
}
func (h *timeHeap) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	if c := cap(old); c > shrinkAbove && n-1 < c/shrinkRatio { // let a burst's array go
		*h = append(make(timeHeap, 0, 2*(n-1)), old[:n-1]...)
	}
	e.index = -1
	return e
}
