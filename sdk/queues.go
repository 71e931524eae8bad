package sdk

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// WorkerQueue is one of the queues a [Worker] consumes (WorkerOptions.Queues).
type WorkerQueue struct {
	// Name is the queue.
	Name string
	// Weight is the queue's share of the Worker's slots while several
	// queues have work: with weights 3 and 1, three deliveries of the first
	// for one of the second. Default 1. Ignored with WorkerOptions.Priority.
	// The weights of a Worker's queues must add up to at most
	// [MaxQueueWeights]; [NewWorker] refuses more (the allocator's sums
	// would overflow and split the slots wrongly).
	Weight int
}

// MaxQueueWeights bounds the sum of the weights of a Worker's queues
// (WorkerQueue.Weight, 0 counting as 1): 2147483647, which the allocator's
// running scores hold without overflow on every platform.
const MaxQueueWeights = math.MaxInt32

// ErrUnknownQueue is returned by [Worker.Pause] and [Worker.Resume] for a
// queue the Worker does not consume. It wraps [ErrNotFound].
var ErrUnknownQueue = fmt.Errorf("berth: worker does not consume this queue: %w", ErrNotFound)

// queueState is one consumed queue: its weight, its pause switch and, in a
// multi-queue Run, the slots the allocator handed it.
type queueState struct {
	name   string
	weight int
	// cur is the smooth weighted round robin's running score: int64, so
	// that with weights adding up to MaxQueueWeights it cannot overflow
	// where int has 32 bits.
	cur int64

	slots chan int     // multi-queue: slots handed to this queue's receiver
	want  atomic.Int64 // multi-queue: slots the receiver may hold waiting (1 while the queue is idle)
	// dry: multi-queue, its last Receive found the queue empty; with
	// Priority the next slot goes to a later queue first (see pick).
	dry atomic.Bool

	receiving atomic.Int32 // Receive calls in flight on this queue
	health    queueHealth  // whether its Receives are failing (sdk/health.go)

	paused atomic.Bool
	mu     sync.Mutex
	run    context.Context // the Run's receive context while it runs
	epoch  atomic.Pointer[epoch]
	resume chan struct{} // closed by Resume; replaced by Pause
	// stopCancel cancels the StopReceiving its Pause started (a
	// ReceiveStopper), nil when none; Resume calls it. Under mu.
	stopCancel context.CancelFunc
}

// epoch is a receive context that Pause cancels: a Receive waiting on a
// queue being paused returns at once.
type epoch struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newQueueStates(o WorkerOptions) []*queueState {
	if len(o.Queues) == 0 {
		return []*queueState{{name: o.Queue, weight: 1, resume: make(chan struct{})}}
	}
	qs := make([]*queueState, len(o.Queues))
	for i, q := range o.Queues {
		qs[i] = &queueState{name: q.Name, weight: q.Weight, resume: make(chan struct{})}
	}
	return qs
}

// validateQueues checks WorkerOptions.Queues and sets Queue to their names
// joined by commas (for logs and Health).
func (o *WorkerOptions) validateQueues() error {
	if len(o.Queues) == 0 {
		return ValidateQueueName(o.Queue)
	}
	if o.Queue != "" {
		return fmt.Errorf("%w: set Queue or Queues, not both", ErrInvalidQueue)
	}
	seen := make(map[string]bool, len(o.Queues))
	var weights int64 // each weight is checked before it is added: no overflow
	qs := make([]WorkerQueue, len(o.Queues))
	names := make([]string, len(o.Queues))
	for i, q := range o.Queues {
		if err := ValidateQueueName(q.Name); err != nil {
			return err
		}
		if seen[q.Name] {
			return fmt.Errorf("%w: %q listed twice in Queues", ErrInvalidQueue, q.Name)
		}
		seen[q.Name] = true
		if q.Weight < 0 {
			return fmt.Errorf("%w: %q has a negative weight", ErrInvalidQueue, q.Name)
		}
		if q.Weight == 0 {
			q.Weight = 1
		}
		if int64(q.Weight) > MaxQueueWeights-weights {
			return fmt.Errorf("%w: %w: the weights of Queues add up to more than %d (at %q)", ErrInvalidOptions, ErrInvalidQueue, MaxQueueWeights, q.Name)
		}
		weights += int64(q.Weight)
		qs[i], names[i] = q, q.Name
	}
	o.Queues = qs
	o.Queue = strings.Join(names, ",")
	return nil
}

// queue returns the state of the named queue, nil when not consumed.
func (w *Worker) queue(name string) *queueState {
	for _, q := range w.queues {
		if q.name == name {
			return q
		}
	}
	return nil
}

// Pause stops receiving from queue: no new Receive is made on it (one
// waiting is interrupted) until Resume. Deliveries already received — running
// or prefetched — are not touched: they run and settle as usual, and their
// leases are kept. Messages the broker took in ahead of Receive (a
// [ReceiveStopper]: RabbitMQ's consumer prefetch) are handed back, in the
// background, for other consumers to take; the first Receive after Resume
// takes messages in again. That background call is bounded (a minute),
// stops being waited for at Resume, and Run waits for it before returning,
// so that no call of the Worker's outlives its Run on a broker the caller
// closes next. Pause works before and during Run, and lasts across
// Runs; it is idempotent. It applies to this Worker only: pausing a queue
// for every consumer (other processes) is the broker's or the operator's
// business (see ARCHITECTURE.md, "Several queues per Worker"). It returns
// [ErrUnknownQueue] for a queue the Worker does not consume.
func (w *Worker) Pause(queue string) error {
	q := w.queue(queue)
	if q == nil {
		return fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.paused.Load() {
		return nil
	}
	q.paused.Store(true)
	q.resume = make(chan struct{})
	if ep := q.epoch.Swap(nil); ep != nil {
		ep.cancel()
	}
	if rs, ok := w.sub.(ReceiveStopper); ok {
		// After the cancel above, so that a Receive it interrupts returns
		// rather than starting the broker's consumer again.
		w.startStopReceiving(rs, q)
	}
	return nil
}

// stopCall is a StopReceiving that Pause started: Resume and the end of Run
// cancel it, and Run waits for it to return.
type stopCall struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startStopReceiving starts, off Pause's caller (handing back takes server
// round trips), the StopReceiving of paused q; under q.mu.
func (w *Worker) startStopReceiving(rs ReceiveStopper, q *queueState) {
	ctx, cancel := context.WithTimeout(context.Background(), stopReceivingTimeout)
	call := &stopCall{cancel: cancel, done: make(chan struct{})}
	q.stopCancel = cancel
	w.stopMu.Lock()
	if w.stops == nil {
		w.stops = map[*stopCall]struct{}{}
	}
	w.stops[call] = struct{}{}
	w.stopMu.Unlock()
	go func() {
		defer close(call.done)
		defer func() {
			w.stopMu.Lock()
			delete(w.stops, call)
			w.stopMu.Unlock()
		}()
		defer cancel()
		w.stopReceiving(ctx, rs, q)
	}()
}

// endStopReceiving cancels the StopReceiving calls Pause started and waits
// for them to return: the end of Run, whose broker the caller may close next.
func (w *Worker) endStopReceiving() {
	w.stopMu.Lock()
	calls := make([]*stopCall, 0, len(w.stops))
	for c := range w.stops {
		calls = append(calls, c)
	}
	w.stopMu.Unlock()
	for _, c := range calls {
		c.cancel()
		<-c.done
	}
}

// stopReceivingTimeout bounds the hand-back Pause starts on a
// [ReceiveStopper].
const stopReceivingTimeout = time.Minute

// stopReceiving asks the broker to hand back what it took in of q ahead of
// Receive, unless q was resumed meanwhile. A ctx cancelled (by Resume, or
// the end of Run) is not a failure: the broker's hand-back goes on without
// the call waiting for it.
func (w *Worker) stopReceiving(ctx context.Context, rs ReceiveStopper, q *queueState) {
	if !q.paused.Load() {
		return
	}
	if err := rs.StopReceiving(ctx, q.name); err != nil && !errors.Is(err, ErrClosed) && !errors.Is(ctx.Err(), context.Canceled) {
		w.opts.Logger.Warn("berth: pause: handing back prefetched messages failed; they return when the connection closes", "queue", q.name, "err", err)
	}
}

// Resume lets the Worker receive from a paused queue again. It is
// idempotent and returns [ErrUnknownQueue] for a queue the Worker does not
// consume.
func (w *Worker) Resume(queue string) error {
	q := w.queue(queue)
	if q == nil {
		return fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	q.mu.Lock()
	if !q.paused.Load() {
		q.mu.Unlock()
		return nil
	}
	q.paused.Store(false)
	if q.stopCancel != nil {
		q.stopCancel() // the pause's hand-back is not waited for any more
		q.stopCancel = nil
	}
	if q.run != nil {
		q.newEpochLocked()
	}
	close(q.resume)
	q.mu.Unlock()
	w.poke()
	return nil
}

// Paused reports whether queue is paused in this Worker.
func (w *Worker) Paused(queue string) bool {
	q := w.queue(queue)
	return q != nil && q.paused.Load()
}

func (q *queueState) newEpochLocked() {
	ctx, cancel := context.WithCancel(q.run)
	q.epoch.Store(&epoch{ctx: ctx, cancel: cancel})
}

// begin readies q for a Run receiving under ctx.
func (q *queueState) begin(ctx context.Context) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.run = ctx
	if !q.paused.Load() {
		q.newEpochLocked()
	}
}

// end forgets the Run.
func (q *queueState) end() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.run = nil
	if ep := q.epoch.Swap(nil); ep != nil {
		ep.cancel()
	}
}

// receiveContext returns the context for a Receive on q, or nil and a
// channel closed at Resume while q is paused.
func (q *queueState) receiveContext() (context.Context, <-chan struct{}) {
	if ep := q.epoch.Load(); ep != nil && !q.paused.Load() {
		return ep.ctx, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if ep := q.epoch.Load(); ep != nil && !q.paused.Load() {
		return ep.ctx, nil
	}
	return nil, q.resume
}

// poke wakes the multi-queue allocator (a queue resumed, took slots or
// changed what it wants).
func (w *Worker) poke() {
	if ch := w.wake; ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// receiveAll runs the receive side of Run: the one queue's receive loop, or
// for several queues one loop per queue fed slots by the allocator.
func (w *Worker) receiveAll(ctx context.Context, free chan int, rq *runQueue, wake chan struct{}, held []atomic.Pointer[task]) error {
	// Receives run under base, which outlives ctx for a LongPoller (see
	// receiveBase); the loops stop taking slots when ctx is done.
	base, release := w.receiveBase(ctx)
	defer release()
	// Every Receive tells the broker how many deliveries the Worker holds
	// at most (a prefetch sized by one Receive's max was as small as the
	// slots an idle queue holds).
	base = WithReceiveCapacity(base, cap(free))
	if len(w.queues) == 1 {
		q := w.queues[0]
		if w.opts.ReceiveLoops <= 1 {
			q.begin(base)
			defer q.end()
			return w.receive(ctx, q, free, free, rq, wake, held)
		}
		// Several loops on the one queue, sharing the free slots; a loop
		// that stops for good (closed broker, missing queue) stops them all,
		// their Receives under way included (they run under bctx): one
		// waiting on an idle queue might never return.
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		bctx, bcancel := context.WithCancel(base)
		defer bcancel()
		q.begin(bctx)
		defer q.end()
		var wg sync.WaitGroup
		errs := make([]error, w.opts.ReceiveLoops)
		for i := range w.opts.ReceiveLoops {
			wg.Go(func() {
				if errs[i] = w.receive(rctx, q, free, free, rq, wake, held); errs[i] != nil {
					cancel()
					bcancel()
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bctx, bcancel := context.WithCancel(base)
	defer bcancel()
	capacity := cap(free)
	var wg sync.WaitGroup
	errs := make(chan error, len(w.queues))
	for _, q := range w.queues {
		q.slots = make(chan int, capacity)
		// Every queue starts active: a Receive shows soon enough (at most
		// QueueIdleWait) whether it has work, and a queue whose receiver is
		// slow to start still gets its share of the slots meanwhile. Except
		// on a LongPoller, whose Receive of several on an empty queue would
		// be cut at QueueIdleWait, and a long poll cut short may take the
		// next messages on the server and hide them for a visibility
		// timeout: there each queue starts with a poll of one, which is
		// never cut, and asks for more once a Receive comes back full.
		if w.longPoll {
			q.want.Store(1)
		} else {
			q.want.Store(int64(capacity))
		}
		q.begin(bctx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.receive(rctx, q, q.slots, free, rq, nil, held); err != nil {
				errs <- err
				cancel() // a closed broker or a missing queue stops the Worker
				bcancel()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.allocate(rctx, free)
	}()
	wg.Wait()
	for _, q := range w.queues {
		q.end()
		for len(q.slots) > 0 { // slots handed out but never used
			free <- <-q.slots
		}
	}
	close(errs)
	var err error
	for e := range errs {
		err = errors.Join(err, e)
	}
	return err
}

// receiveBase returns the context the Receive calls run under, and a
// function that ends it. It is ctx, except for a [LongPoller]: then it ends
// only LongPollGrace (or ReceiveWait plus a second, at most DrainTimeout)
// after ctx, so that a long poll in flight at shutdown returns what the
// server handed it, for the drain to run, instead of being cut off after
// the server counted the receive.
func (w *Worker) receiveBase(ctx context.Context) (context.Context, func()) {
	lp, ok := w.sub.(LongPoller)
	if !ok {
		return ctx, func() {}
	}
	wait := min(lp.ReceiveWait()+time.Second, LongPollGrace, w.opts.DrainTimeout)
	base, cancel := context.WithCancel(detach(ctx))
	timer := time.AfterFunc(wait, cancel)
	timer.Stop() // started when ctx ends
	stop := context.AfterFunc(ctx, func() { timer.Reset(wait) })
	return base, func() {
		stop()
		timer.Stop()
		cancel() // also when a late Reset restarted the timer: cancel is idempotent
	}
}

// allocate hands free slots to the queues' receivers: by smooth weighted
// round robin among the queues that can take one (not paused, holding fewer
// waiting slots than they want), or to the first of them with Priority.
// A queue whose last Receive came back short is idle and wants one slot:
// an empty queue does not tie up the slots the others could use. An idle
// queue whose Receive is under way gets a waiting slot too, except when the
// idle queues would then hold every slot while another queue has none to
// receive with: with few slots (two, at Concurrency 1) the slot it held
// waiting kept the last one from a queue with work until its Receive ran
// out, and that queue ran one job per QueueIdleWait.
func (w *Worker) allocate(ctx context.Context, free chan int) {
	for {
		var slot int
		select {
		case slot = <-free:
		case <-ctx.Done():
			return
		}
		for {
			if q := w.pick(free); q != nil {
				q.slots <- slot // buffered to the capacity: never blocks
				break
			}
			select {
			case <-w.wake:
			case <-ctx.Done():
				free <- slot
				return
			}
		}
	}
}

// pick chooses the queue for the next slot (taken from free), nil when
// none can take one.
func (w *Worker) pick(free chan int) *queueState {
	var best, skipped *queueState
	var total int64
	// A queue with no slot waiting and no Receive under way has nothing to
	// receive with. When the idle queues polling hold every other slot in
	// use (none runs or waits for the other queues), such a queue gets this
	// one: an idle queue's waiting slot would leave it none at all.
	emptyHanded := false
	idleHeld := 0 // slots of the idle queues polling: in their Receive (1) and waiting
	for _, q := range w.queues {
		if q.paused.Load() {
			continue
		}
		polling := q.receiving.Load() > 0
		if len(q.slots) == 0 && !polling {
			emptyHanded = true
		}
		if polling && q.want.Load() == 1 {
			idleHeld += 1 + len(q.slots)
		}
	}
	starved := emptyHanded && cap(free)-len(free)-1 <= idleHeld
	for _, q := range w.queues {
		if q.paused.Load() {
			continue
		}
		if starved && q.want.Load() == 1 && q.receiving.Load() > 0 {
			continue // idle and polling: its waiting slot can wait
		}
		if w.opts.Priority {
			if want := q.want.Load(); int64(len(q.slots)) < want {
				// A queue whose last Receive found it empty lets a later
				// queue have this slot first: with one slot to share it
				// would otherwise poll for ever and the others starve.
				if want == 1 && q.dry.Swap(false) {
					if skipped == nil {
						skipped = q
					}
					continue
				}
				return q
			} else if want > 1 {
				return nil // a queue with work comes first: keep the slot for it
			}
			continue // idle, holding its one slot: ask the next
		}
		if int64(len(q.slots)) >= q.want.Load() {
			continue
		}
		q.cur += int64(q.weight)
		total += int64(q.weight)
		if best == nil || q.cur > best.cur {
			best = q
		}
	}
	if best != nil {
		best.cur -= total
	}
	if best == nil {
		return skipped // no later queue could take it
	}
	return best
}

// receiveBounded is a multi-queue Receive: it waits at most QueueIdleWait,
// so that a queue that ran dry does not hold slots the other queues could
// use while its Receive waits for work; a short result makes the queue idle
// (one slot). Even a Receive of one is bounded: with one slot in all, or
// with Priority and a queue that ran dry while its handlers held all but
// one of its slots, an unbounded wait kept the slot from the other queues
// for as long as the queue stayed empty. Except on a [LongPoller]: there a
// Receive of one is left to end its long poll by itself (within
// ReceiveWait), since a poll cut short may have taken messages on the
// server that come back a visibility timeout later with a receive counted.
// A broker that leases at the server (SQS,
// PostgreSQL, JetStream) may have leased a message to the call it abandons:
// that message comes back when its lease runs out.
//
// cut reports a Receive the wait cut off empty: it returned nothing, and
// either no error or the wait's own (context.DeadlineExceeded, which it
// turns into nil). A cut-off is no proof that the broker works, only that
// it did not fail for QueueIdleWait (see workerHealth.idle); an error of
// another kind, even one returned after the wait ran out (a call that
// ignored its context until its own timeout), is the Receive's failure.
func (w *Worker) receiveBounded(ctx context.Context, q *queueState, n int) (ds []Delivery, cut bool, err error) {
	tctx, cancel := context.WithTimeout(ctx, w.opts.QueueIdleWait)
	defer cancel()
	ds, err = w.sub.Receive(tctx, q.name, n)
	if len(ds) == 0 && ctx.Err() == nil && tctx.Err() != nil && (err == nil || errors.Is(err, context.DeadlineExceeded)) {
		return ds, true, nil // the wait ran out: the queue is idle
	}
	return ds, false, err
}

// Queues returns the names of the queues the Worker consumes, in the order
// of WorkerOptions.Queues (or the one Queue).
func (w *Worker) Queues() []string {
	names := make([]string, len(w.queues))
	for i, q := range w.queues {
		names[i] = q.name
	}
	return names
}
