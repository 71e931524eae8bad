package sdk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Worker receives deliveries from one queue, runs a Handler on each with
// bounded concurrency, keeps their leases alive while they run, and settles
// each exactly once from the handler's result (see the package doc).
//
// A Worker is safe to share, but runs one Run at a time.
type Worker struct {
	sub     Subscriber
	handler Handler
	opts    WorkerOptions
	leaseOb []LeaseObserver

	timeoutTick time.Duration // the watchdog's period, 0 without timeouts
	maxAttempts int           // the broker's poison cap (DeliveryCapReporter), 0 for none
	longPoll    bool          // sub is a LongPoller: its Receive ends by itself within ReceiveWait
	recvBatch   int           // sub is a ReceiveBatcher: the most one Receive returns; 0 if not

	randMu   sync.Mutex
	running  atomic.Bool
	nilStart atomic.Bool // an observer's Start returned a nil context: logged once
	shared   atomic.Pointer[settleCtx]
	acking   atomic.Int64 // background acks (AsyncAcker) under way, holding their slots
	health   workerHealth // what Health reports (sdk/health.go)

	queues []*queueState // the consumed queues (sdk/queues.go)
	// stops are the StopReceiving calls Pause started and Run's end waits
	// for (sdk/queues.go).
	stopMu sync.Mutex
	stops  map[*stopCall]struct{}
	wake   chan struct{} // wakes the multi-queue allocator; nil with one queue
}

// settleCtx is a settlement context shared by the settlements of a short
// window: creating a deadline context (a clock read, a timer, allocations)
// for every settlement cost more than the memory broker's whole Ack. Each
// settlement still gets at least 90% of SettleTimeout.
type settleCtx struct {
	ctx          context.Context
	cancel       context.CancelFunc
	refreshAfter time.Duration // on the monoNow clock
}

// clockEpoch anchors monoNow.
var clockEpoch = time.Now()

// monoNow reads the monotonic clock alone, as time since clockEpoch:
// time.Now reads the wall clock too, which costs twice as much on VMs whose
// clock source is slow (kvm-clock: 56 ns against 30), and the Worker reads
// the clock once a message to bound its settlement.
func monoNow() time.Duration { return time.Since(clockEpoch) }

// ErrWorkerRunning is returned by Run when the Worker is already running.
var ErrWorkerRunning = errors.New("berth: worker already running")

// NewWorker returns a Worker that consumes opts.Queue from sub with h, wrapped
// in opts.Middleware. It validates opts and returns an error for a bad one
// (matching [ErrInvalidOptions], or [ErrInvalidQueue] for a queue name).
// It checks opts against what sub reports about itself ([CheckConfig]): a
// contradiction is logged as a warning, or with opts.StrictConfig returned as
// a [*ConfigError].
func NewWorker(sub Subscriber, h Handler, opts WorkerOptions) (*Worker, error) {
	if sub == nil || h == nil {
		return nil, fmt.Errorf("%w: nil subscriber or handler", ErrInvalidOptions)
	}
	if lr, ok := sub.(LeaseReporter); ok && opts.Lease == 0 {
		opts.Lease = lr.Lease()
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	recvBatch := 0
	if rb, ok := sub.(ReceiveBatcher); ok {
		recvBatch = max(rb.ReceiveBatch(), 0)
	}
	if opts.ReceiveLoops == 0 && recvBatch > 0 {
		// Enough loops for the slots to fill in one round of calls.
		slots := o.Concurrency + o.Prefetch
		o.ReceiveLoops = min(max((slots+recvBatch-1)/recvBatch, 1), MaxDefaultReceiveLoops)
	}
	limit, err := applyConfig(sub, o)
	if err != nil {
		return nil, err
	}
	_, longPoll := sub.(LongPoller)
	w := &Worker{sub: sub, handler: Chain(h, o.Middleware...), opts: o, timeoutTick: timeoutTick(o), maxAttempts: limit, longPoll: longPoll, recvBatch: recvBatch}
	w.queues = newQueueStates(o)
	if len(w.queues) > 1 {
		w.wake = make(chan struct{}, 1)
	}
	for _, ob := range o.Observers {
		if lo, ok := ob.(LeaseObserver); ok {
			w.leaseOb = append(w.leaseOb, lo)
		}
	}
	return w, nil
}

// task is one received delivery while the Worker holds it.
type task struct {
	d         Delivery
	received  int64        // unix nanos of the Receive that returned it
	extended  atomic.Int64 // unix nanos of the last lease start or extension
	started   int64        // unix nanos when the watchdog first saw the handler run; under mu
	mu        sync.Mutex
	lost      atomic.Bool     // the lease was lost: do not run, do not settle
	settling  atomic.Bool     // the handler returned: the heartbeat leaves it alone, unless acking
	acking    atomic.Bool     // its background ack (AsyncAcker) is under way: the heartbeat keeps its lease
	timedOut  atomic.Bool     // the handler ran past its timeout: its lease is no longer extended
	extending atomic.Bool     // the heartbeat's extension of it is under way
	slot      int32           // index in the held table, returned to the free list when done
	begun     bool            // the handler runs (for the watchdog); under mu
	ctx       context.Context // the handler's context with the observers', for lease observers; under mu
	// hc is the handler's cancellable context. A stop before the handler
	// starts cancels it already: the handler then starts cancelled.
	hc handlerCtx
}

// context returns the handler's context once it runs, else fallback.
func (t *task) context(fallback context.Context) context.Context {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx != nil {
		return t.ctx
	}
	return fallback
}

// keepLease reports whether the heartbeat extends t's lease: while its
// handler runs within its timeout, and while its background ack
// ([AsyncAcker]) is under way, until that ack returns. A job whose ack is
// slow to be written (a lock, a slow disk) must not see its lease lapse
// meanwhile: another consumer would claim it and run it again, and the ack,
// fenced by the lease, would then be refused. A handler that ran past its
// timeout and still runs gets no extension (it must not hold the job for
// ever: its lease runs out); once it returned and its ack is under way, it
// does.
func (t *task) keepLease() bool {
	if t.acking.Load() {
		return true
	}
	return !t.settling.Load() && !t.timedOut.Load()
}

func (t *task) loseLease() {
	t.lost.Store(true)
	t.stop(ErrLeaseLost)
}

// leaseGone records what the heartbeat found: t's lease is lost, or will
// run out before an extension can recover. A running handler is stopped
// (loseLease). One that returned, whose background ack is under way, is
// only marked, so that the heartbeat tries no more: its context stays as
// it is until the ack's outcome (which reports the loss) is given to the
// observers with it.
func (t *task) leaseGone() {
	if t.settling.Load() {
		t.lost.Store(true)
		return
	}
	t.loseLease()
}

// stop cancels the handler's context with cause; before the handler runs,
// its context starts cancelled with cause. The first cause stays.
func (t *task) stop(cause error) { t.hc.cancel(cause) }

// shutdown stops t with [ErrShutdown] (Run's drain deadline, Process's
// ctx), unless its handler has returned (settling): that handler is no
// longer running, and its settlement goes by its result, as a timeout
// spares it (see handlerCtx.cancelUnless).
func (t *task) shutdown() { t.hc.cancelUnless(ErrShutdown, &t.settling) }

// Run processes deliveries until ctx is done, then drains: it stops
// receiving, releases deliveries not yet started (or, where a delivery
// cannot be handed back without consuming an attempt — it is no
// [Releaser], as on SQS — runs them too), gives running handlers up to
// DrainTimeout to finish, then cancels their context (cause [ErrShutdown])
// and releases what they hand back, flushes buffered settlements and returns.
//
// It returns nil after a drain that followed ctx; the broker's error when
// the broker is closed ([ErrClosed]) or the queue is invalid or missing
// ([ErrInvalidQueue], [ErrNotFound]); or [ErrDrainTimeout] when handlers
// ignored their cancelled context past the deadline.
//
// Shutdown takes at most DrainTimeout + SettleTimeout + 1s, plus a Flush of
// at most SettleTimeout: handlers that honour their context return within
// DrainTimeout and a settlement; a handler that ignores it is abandoned after
// the extra SettleTimeout + 1s, and its goroutine, still owned by nothing but
// the handler, settles its delivery when (if) it returns. The defaults
// ([DefaultDrainTimeout], [DefaultSettleTimeout]) fit Kubernetes' 30s grace
// period; when you change them, keep DrainTimeout + 2·SettleTimeout + 1s
// below the platform's grace period.
func (w *Worker) Run(ctx context.Context) (err error) {
	if !w.running.CompareAndSwap(false, true) {
		return ErrWorkerRunning
	}
	defer w.running.Store(false)
	w.health.start(w.queues)
	defer func() { w.health.stop(err) }()
	o := w.opts

	// Handlers outlive ctx by the drain deadline: their context is cancelled
	// only when that passes (or their lease is lost). base cannot be
	// cancelled, so a handler's context does not register with a shared
	// parent (a mutex all handlers would contend on); shutdown cancels each
	// held task instead.
	base := detach(ctx)
	// stopping is set when this Run's drain deadline passes: running
	// handlers are cancelled, and deliveries not started are released.
	// It belongs to this Run, not the Worker: goroutines a Run abandoned
	// at its deadline must keep seeing it set after a later Run starts.
	stopping := new(atomic.Bool)

	// Each held delivery occupies a slot: capacity bounds running plus
	// prefetched work, and the slot table is what the heartbeat walks.
	capacity := o.Concurrency + o.Prefetch
	free := make(chan int, capacity)
	for i := range capacity {
		free <- i
	}
	held := make([]atomic.Pointer[task], capacity)
	rq := newRunQueue(capacity)
	jobs := rq.jobs
	// With one queue the receive loops wait for a batch's worth of free
	// slots on wake, which handlers signal only when the receiver has
	// something to do (half the slots free, or the prefetched work ran
	// out): waking the receiver for every returned slot cost a goroutine
	// switch per message. With several queues the allocator takes every
	// free slot itself, and wake is nil.
	var wake chan struct{}
	if len(w.queues) == 1 {
		wake = make(chan struct{}, 1)
	}
	half := max(capacity/2, 1)
	signal := func() { signalWake(wake) }

	done := func(t *task) {
		held[t.slot].Store(nil)
		w.health.held.Add(-1)
		free <- int(t.slot)
		if wake != nil && (len(free) >= half || len(jobs) == 0) {
			signal()
		}
	}
	// Acks finishing in the background (AsyncAcker) come back on acked
	// (never full: each holds a slot) to one goroutine that reports them
	// and frees their slots; asyncs counts those not yet back.
	var asyncs sync.WaitGroup
	acked := make(chan *asyncAck, capacity)
	finished := make(chan struct{})
	// reportAcks is that goroutine. An observer that calls runtime.Goexit
	// while an ack is reported ends it (recover sees nothing): its deferred
	// call frees that ack's slot and starts a replacement, as handlers does,
	// so that the acks after it are still reported and their slots freed.
	var reportAcks func()
	reportAcks = func() {
		var reporting *asyncAck // set while finishAsync reports it
		defer func() {
			if reporting == nil {
				close(finished)
				return
			}
			reporting.t.hc.cancel(nil)
			w.acking.Add(-1)
			done(reporting.t)
			asyncs.Done()
			go reportAcks()
		}()
		for a := range acked {
			reporting = a
			w.finishAsync(a)
			reporting = nil
			w.acking.Add(-1) // before its slot is back: receive sees both at once
			done(a.t)
			asyncs.Done()
		}
	}
	go reportAcks()
	var pool sync.WaitGroup
	// handlers is one handler goroutine. One whose handler called
	// runtime.Goexit ends (process has settled the task: see goexited); its
	// deferred call frees the task's slot and starts a replacement, so that
	// Concurrency goroutines keep running.
	var handlers func()
	handlers = func() {
		var running *task // set while process runs it
		defer func() {
			if running != nil { // Goexit: a panic would end the process
				done(running)
				pool.Add(1) // before Done: a pool.Wait under way goes on waiting
				go handlers()
			}
			pool.Done()
		}()
		k := taker{r: rq}
		for {
			t, ok := k.next()
			if !ok {
				return
			}
			if wake != nil && len(jobs) == 0 {
				signal() // the prefetched work ran out: receive again
			}
			switch {
			case t.lost.Load():
				w.logLeaseLost(base, t.d)
			case ctx.Err() != nil && !w.finishAtDrain(t.d, stopping):
				w.release(base, t.d, "not started before shutdown")
			default:
				running = t
				_, async := w.process(base, t, acked, &asyncs, stopping)
				running = nil
				if async {
					continue // the slot is freed when the ack is back
				}
			}
			done(t)
		}
	}
	for range o.Concurrency {
		pool.Add(1)
		go handlers()
	}

	hbStop := make(chan struct{})
	var hb sync.WaitGroup
	if o.HeartbeatInterval > 0 {
		hb.Add(1)
		go func() {
			defer hb.Done()
			w.heartbeat(base, held, hbStop)
		}()
	}
	if w.timeoutTick > 0 {
		hb.Add(1)
		go func() {
			defer hb.Done()
			w.watchdog(held, hbStop)
		}()
	}

	// The drain deadline counts from ctx's end: a LongPoller's last Receive
	// may have taken part of it (receiveBase).
	var stoppedAt atomic.Int64
	unwatch := context.AfterFunc(ctx, func() { stoppedAt.Store(time.Now().UnixNano()) })
	defer unwatch()
	err = w.receiveAll(ctx, free, rq, wake, held)
	w.health.state.Store(hDraining)
	// Deliveries not started are handed back now, not when a handler
	// goroutine comes free: every one may be busy with a long job until the
	// drain deadline, and meanwhile another consumer could run them. Those
	// that cannot be handed back without consuming an attempt (no
	// Releaser: see finishAtDrain) stay queued for the handlers to run.
	// handBack settles t, which no handler started, at shutdown: handed
	// back (its lease still held) or logged as lost, then its slot freed.
	handBack := func(t *task, why string) {
		if t.lost.Load() {
			w.logLeaseLost(base, t.d)
		} else {
			w.release(base, t.d, why)
		}
		done(t)
	}
	var early sync.WaitGroup
	var keep []*task
	for t, ok := rq.take(); ok; t, ok = rq.take() {
		if _, rel := t.d.(Releaser); !rel && !t.lost.Load() {
			keep = append(keep, t)
			continue
		}
		early.Go(func() { handBack(t, "not started before shutdown") })
	}
	for _, t := range keep {
		rq.push(t)
	}
	if len(keep) > 0 {
		rq.wakeOne()
	}
	rq.close()

	drained := make(chan struct{})
	go func() {
		pool.Wait()
		early.Wait()
		asyncs.Wait() // bounded by SettleTimeout: AckAsync reports by its ctx's end
		close(acked)
		<-finished
		close(drained)
	}()
	drainFor := o.DrainTimeout
	if at := stoppedAt.Load(); at != 0 {
		drainFor = max(drainFor-time.Since(time.Unix(0, at)), 0)
	}
	deadline := time.NewTimer(drainFor)
	defer deadline.Stop()
	select {
	case <-drained:
	case <-deadline.C:
		o.Logger.Warn("berth: drain deadline passed; cancelling running handlers", "queue", o.Queue)
		stopping.Store(true)
		for i := range held {
			if t := held[i].Load(); t != nil {
				t.shutdown()
			}
		}
		// Deliveries not started are handed back now, not when a handler
		// goroutine comes free: one held by a handler that ignores its
		// context may never, and after Run returns no heartbeat keeps
		// their leases (they would come back with an attempt counted).
		var late sync.WaitGroup
		for t, ok := rq.take(); ok; t, ok = rq.take() {
			late.Go(func() { handBack(t, "not started before the drain deadline") })
		}
		settled := make(chan struct{})
		go func() {
			<-drained
			late.Wait()
			close(settled)
		}()
		grace := time.NewTimer(o.SettleTimeout + time.Second)
		defer grace.Stop()
		select {
		case <-settled:
		case <-grace.C:
			err = errors.Join(err, ErrDrainTimeout)
		}
	}
	close(hbStop)
	hb.Wait()
	w.endStopReceiving()
	// The next Run's settlements start a context of their own. This one is
	// not cancelled: a concurrent Process, or a handler abandoned at the
	// drain deadline, may be settling under it; its timer releases it at
	// its deadline.
	w.shared.Store(nil)

	if f, ok := w.sub.(Flusher); ok {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.SettleTimeout)
		if ferr := f.Flush(fctx); ferr != nil {
			err = errors.Join(err, ferr)
		}
		cancel()
	}
	return err
}

// finishAtDrain reports whether d, received but not started when the drain
// began, is run rather than handed back: when handing it back would consume
// an attempt (d is no [Releaser]: Retry is all it has, and SQS counts every
// receive) and the drain deadline has not passed. Run's drain then takes a
// little longer (the prefetched deliveries' handler time, within
// DrainTimeout) instead of charging every prefetched job an attempt.
func (w *Worker) finishAtDrain(d Delivery, stopping *atomic.Bool) bool {
	if _, ok := d.(Releaser); ok {
		return false
	}
	return !stopping.Load()
}

// signalWake leaves a wake-up on wake (which keeps one) for a receive loop.
func signalWake(wake chan struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}

// receive fills slots taken from src with deliveries of q until ctx is
// done, and gives back to free those it did not fill. With one queue src is
// free, and the loop waits on wake (see Run) until half the slots are free
// or the prefetched work ran out, so that one Receive fetches a batch
// instead of one message per call (a claim statement, an API call). With
// several queues src is the slots the allocator handed q, and wake is nil.
func (w *Worker) receive(ctx context.Context, q *queueState, src, free chan int, rq *runQueue, wake chan struct{}, held []atomic.Pointer[task]) error {
	o := w.opts
	multi := wake == nil
	half := max(cap(free)/2, 1)
	// take: the most slots one Receive gets; need: how many free slots a
	// loop waits for while work is under way. On a ReceiveBatcher a
	// Receive returns at most recvBatch, so a loop takes no more, nor more
	// than its share of the slots: the rest stay free for the other loops'
	// calls, which are then in flight together (with 16 slots and batches
	// of 10, a loop that took 10 left the other 6, short of a batch, until
	// its own call ended). It waits for a full batch while received work
	// waits for a handler or another loop's Receive is in flight. With
	// several queues a Receive takes at most a batch too: a full batch is
	// a queue with work, where a Receive given more slots than it can fill
	// came back short and made the queue idle (a poll of one every other
	// call).
	take, need := cap(free), half
	if w.recvBatch > 0 {
		take = min(take, w.recvBatch)
		if !multi {
			take = min(take, max(cap(free)/max(o.ReceiveLoops, 1), 1))
			need = min(need, take)
		}
	}
	jobs := rq.jobs
	busy := func() bool {
		return len(jobs) > 0 || w.acking.Load() > 0 || (w.recvBatch > 0 && q.receiving.Load() > 0)
	}
	slots := make([]int, 0, take)
	failures := 0
	for {
		slots = slots[:0]
		if multi {
			q.health.waitingForSlot(true)
			select {
			case i := <-src:
				slots = append(slots, i)
			case <-ctx.Done():
				return nil
			}
			q.health.waitingForSlot(false)
		} else {
			// Handlers signal wake after every change that can make this
			// condition true, and wake keeps one signal: none is lost.
			// Acks under way (AsyncAcker) hold slots that come back
			// together when their batch is written: wait for them too
			// rather than claim one job per freed slot.
			for n := len(src); n == 0 || (n < need && busy()); n = len(src) {
				select {
				case <-wake:
				case <-ctx.Done():
					return nil
				}
			}
		}
	fill:
		for len(slots) < cap(slots) {
			select {
			case i := <-src:
				slots = append(slots, i)
			default:
				break fill
			}
		}
		if len(slots) == 0 { // another receive loop took them
			continue
		}
		if !multi && len(src) > 0 && w.opts.ReceiveLoops > 1 {
			// Slots are left (take bounded this loop's share): pass the
			// wake on to another loop.
			signalWake(wake)
		}
		if multi && w.longPoll && len(slots) > 1 && q.want.Load() == 1 {
			// An idle queue on a LongPoller polls for one: a poll of
			// several would be cut at QueueIdleWait (receiveBounded), and a
			// long poll cut short can hide messages on the server. The
			// slots it was handed meanwhile go back to the others.
			for _, i := range slots[1:] {
				free <- i
			}
			slots = slots[:1]
			w.poke()
		}
		if ctx.Err() != nil {
			// Shutdown: no new Receive. (A LongPoller's Receive context
			// outlives ctx for a grace, see receiveBase: it must not be
			// used to start polls.)
			for _, i := range slots {
				free <- i
			}
			return nil
		}
		rctx, resumed := q.receiveContext()
		if rctx == nil { // paused: hold no slots, make no Receive
			for _, i := range slots {
				free <- i
			}
			w.poke()
			if multi {
				// Wait for a slot, not for Resume: the allocator hands a
				// paused queue none, except one it picked just before
				// Pause, which this branch then hands back at once
				// (waiting for Resume kept it from the other queues). Resume
				// pokes the allocator, which then hands this queue slots.
				continue
			}
			select {
			case <-resumed:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		start := time.Now().UnixNano()
		w.health.receiving(&q.health, start)
		var ds []Delivery
		var err error
		cut := false // cut off empty at QueueIdleWait (receiveBounded)
		q.receiving.Add(1)
		if multi && (len(slots) > 1 || !w.longPoll) {
			ds, cut, err = w.receiveBounded(rctx, q, len(slots))
		} else {
			ds, err = w.sub.Receive(rctx, q.name, len(slots))
		}
		if q.receiving.Add(-1) == 0 && !multi && w.recvBatch > 0 && w.opts.ReceiveLoops > 1 {
			signalWake(wake) // a loop waiting for this call to end may go
		}
		if len(ds) > len(slots) { // a broker bug: never hold more than the slots
			for _, d := range ds[len(slots):] {
				w.release(ctx, d, "received beyond the requested max")
			}
			ds = ds[:len(slots)]
		}
		now := time.Now().UnixNano()
		if cut {
			w.health.idle(&q.health, start)
		} else {
			w.health.received(&q.health, start, now, len(ds), err, rctx.Err() != nil)
		}
		for i, d := range ds {
			t := &task{d: d, slot: int32(slots[i]), received: now}
			t.extended.Store(now)
			held[t.slot].Store(t)
			rq.push(t)
		}
		if len(ds) > 0 {
			rq.wakeOne()
		}
		for _, i := range slots[len(ds):] {
			free <- i
		}
		if multi {
			// A queue that could not fill its slots is idle: it holds one
			// slot waiting, the others go to the queues with work.
			if len(ds) < len(slots) {
				q.want.Store(1)
				q.dry.Store(len(ds) == 0 && err == nil)
			} else {
				q.want.Store(int64(cap(free)))
			}
			w.poke()
		}
		switch {
		case ctx.Err() != nil: // shutdown: what this Receive returned is queued
			return nil
		case err == nil:
			// A cut-off too (cut): it waited QueueIdleWait without failing,
			// enough to retry promptly, though no proof for Health.
			failures = 0
		case rctx.Err() != nil: // paused during the Receive
			continue
		case errors.Is(err, ErrClosed), errors.Is(err, ErrInvalidQueue), errors.Is(err, ErrNotFound):
			// Waiting will not make a closed broker or a missing queue work.
			return err
		default:
			failures++
			delay := Backoff{Base: 50 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.5}.Delay(failures, w.rand())
			o.Logger.Warn("berth: receive failed; backing off", "queue", q.name, "err", err, "delay", delay)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// heartbeat extends the leases of held deliveries every HeartbeatInterval,
// and marks a delivery lost when its extension is refused or its lease
// expires while extensions fail. Each extension runs in a goroutine of its
// own, at most one per delivery, so that one slow or retrying extension
// does not hold back the others'.
func (w *Worker) heartbeat(ctx context.Context, held []atomic.Pointer[task], stop <-chan struct{}) {
	o := w.opts
	tick := time.NewTicker(w.tick())
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	// Extensions under way end with the heartbeat (cancel runs before
	// wg.Wait): Run waits for them before it flushes, and a broker that
	// hangs must not stretch shutdown past its documented bound.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		now := time.Now()
		for i := range held {
			t := held[i].Load()
			if t == nil {
				continue
			}
			last := time.Unix(0, t.extended.Load())
			if t.lost.Load() || !t.keepLease() || now.Sub(last) < o.HeartbeatInterval {
				continue
			}
			if !t.extending.CompareAndSwap(false, true) {
				continue // the last extension is still trying
			}
			wg.Go(func() {
				defer t.extending.Store(false)
				w.extend(ctx, t, last, stop)
			})
		}
	}
}

// watchdog enforces handler timeouts: every timeoutTick it notes when each
// running handler was first seen running and cancels, with cause
// [ErrJobTimeout], those running longer than their type's timeout. One
// goroutine walking the held slots costs nothing per job, where a timer or a
// deadline context per job cost the memory broker's Worker a third of its
// throughput; the price is precision: a timeout fires up to two ticks late.
func (w *Worker) watchdog(held []atomic.Pointer[task], stop <-chan struct{}) {
	tick := time.NewTicker(w.timeoutTick)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		now := time.Now().UnixNano()
		for i := range held {
			t := held[i].Load()
			if t == nil || t.settling.Load() || t.timedOut.Load() {
				continue
			}
			timeout := w.timeout(t.d.Message().Type)
			if timeout <= 0 {
				continue
			}
			t.mu.Lock()
			if !t.begun { // not started
				t.mu.Unlock()
				continue
			}
			if t.started == 0 {
				t.started = now
			}
			// Not once the handler returned (settling, set since the
			// check above): its settlement then goes by its result. Nor
			// marked timed out when another cause stopped it first (the
			// drain deadline's ErrShutdown): that handler is settled by
			// a release, and the heartbeat keeps its lease until then.
			if now-t.started >= int64(timeout) && t.hc.cancelUnless(ErrJobTimeout, &t.settling) {
				t.timedOut.Store(true)
			}
			t.mu.Unlock()
		}
	}
}

// timeoutTick is the watchdog's period: a twentieth of the shortest
// timeout, between 1ms and 1s; 0 when no timeout applies.
func timeoutTick(o WorkerOptions) time.Duration {
	shortest := o.Timeout
	for _, d := range o.TimeoutByType {
		if d > 0 && (shortest <= 0 || d < shortest) {
			shortest = d
		}
	}
	if shortest <= 0 {
		return 0
	}
	return min(max(shortest/20, time.Millisecond), time.Second)
}

// tick is the heartbeat's period: half the interval, so that an extension
// is tried within HeartbeatInterval·1.5 of the last one.
func (w *Worker) tick() time.Duration { return max(w.opts.HeartbeatInterval/2, time.Millisecond) }

func (w *Worker) extend(ctx context.Context, t *task, last time.Time, stop <-chan struct{}) {
	o := w.opts
	// A failed attempt (a reset connection, a failover) is tried again
	// after a short pause rather than at the next tick: a lease survives a
	// blip that costs one reconnection. The last attempt starts while the
	// lease still has a tick to run, when it could still arrive in time.
	giveUp := last.Add(o.Lease - w.tick())
	pause := min(w.tick()/8, 50*time.Millisecond)
	for attempt := 0; ; attempt++ {
		ectx, cancel := context.WithTimeout(ctx, min(o.SettleTimeout, max(time.Until(last.Add(o.Lease)), time.Millisecond)))
		err := t.d.ExtendLease(ectx, o.Lease)
		cancel()
		if ctx.Err() != nil {
			return // the heartbeat stopped (Run is returning): nothing to report
		}
		if errors.Is(err, ErrAlreadySettled) {
			return // settled while the heartbeat looked: nothing to extend, nothing lost
		}
		// The outcome is acted on before the lease observers are told: one
		// that calls runtime.Goexit ends this goroutine, and a lease lost
		// must still stop the handler (as after a panic in one).
		final := true
		var wait time.Duration
		switch {
		case err == nil:
			t.extended.Store(time.Now().UnixNano())
		case errors.Is(err, ErrLeaseLost):
			t.leaseGone()
		default:
			if wait = min(pause, time.Until(giveUp)); wait <= 0 {
				// The next attempt would come when the lease may have ended and
				// another consumer may hold the message: give up now.
				o.Logger.WarnContext(t.context(ctx), "berth: lease runs out before extensions recover", "queue", o.Queue, LogText("id", t.d.Message().ID), "attempts", attempt+1, "err", err)
				t.leaseGone()
			} else {
				final = false
			}
		}
		if len(w.leaseOb) > 0 {
			hctx := t.context(ctx)
			for _, lo := range w.leaseOb {
				w.observeLease(hctx, lo, t.d, o.Lease, err)
			}
		}
		if final {
			return
		}
		if attempt == 0 {
			o.Logger.WarnContext(t.context(ctx), "berth: lease extension failed; will retry", "queue", o.Queue, LogText("id", t.d.Message().ID), "err", err)
		}
		timer := time.NewTimer(wait)
		select {
		case <-stop:
			timer.Stop()
			return
		case <-timer.C:
		}
		if t.lost.Load() || !t.keepLease() {
			// A handler past its timeout gets no more extensions, even
			// from one under way when the timeout fired: its lease runs
			// out (see WorkerOptions.Timeout).
			return
		}
		pause = min(2*pause, w.tick()/2)
	}
}

// Process runs the Worker's handler on one delivery that the caller received
// itself, and settles it by the same rules as [Worker.Run] (ARCHITECTURE.md,
// "Settlement"): the same middleware, observers, panic recovery, retry
// policy and handler timeout, the same code. It returns the settlement.
//
// Process extends no lease (there is no heartbeat) and takes no concurrency
// slot; it is meant for tests (package berthtest) and for programs that
// receive deliveries themselves. When ctx ends before or while the handler
// runs, the handler's context is cancelled with cause [ErrShutdown] and the
// delivery released, as Run does at its drain deadline. The settlement
// call gets a context of its own, bounded by SettleTimeout, that carries
// ctx's values but not its cancellation.
func (w *Worker) Process(ctx context.Context, d Delivery) Settlement {
	t := &task{d: d, received: time.Now().UnixNano()}
	t.extended.Store(t.received)
	t.started = t.received // the timeout counts from here (the handler context's Deadline)
	stop := context.AfterFunc(ctx, t.shutdown)
	defer stop()
	if ctx.Err() != nil {
		// AfterFunc runs its function in a goroutine of its own, which a
		// quick handler would outrun: a ctx already ended stops the task
		// before the handler starts.
		t.shutdown()
	}
	if timeout := w.timeout(d.Message().Type); timeout > 0 {
		timer := time.AfterFunc(timeout, func() {
			if t.hc.cancelUnless(ErrJobTimeout, &t.settling) {
				t.timedOut.Store(true)
			}
		})
		defer timer.Stop()
	}
	base := &processCtx{detachedCtx: detachedCtx{parent: ctx}}
	defer func() {
		if base.cancel != nil {
			base.cancel()
		}
	}()
	s, _ := w.process(base, t, nil, nil, nil)
	return s
}

// processCtx is the base context of one [Worker.Process] call: its
// settlement gets a context of its own, with the call's values, where Run's
// settlements share one (see settleCtx) — Process calls with different
// values (a trace, a tenant) must not settle under each other's.
type processCtx struct {
	detachedCtx
	settle context.Context // made at the settlement, by settleContext
	cancel context.CancelFunc
}

// asyncAck is a successful job whose ack finishes in the background
// ([AsyncAcker]): what its settlement needs once the ack is back.
type asyncAck struct {
	t   *task
	ctx context.Context // the handler's, cancelled once reported
	s   Settlement
}

// finishAsync reports a background ack as process reports a settlement.
func (w *Worker) finishAsync(a *asyncAck) {
	w.log(a.ctx, a.t.d, a.s)
	w.settledFrom(a.ctx, 0, a.t.d, a.s)
	a.t.hc.cancel(nil)
}

// process runs the handler on t and settles its delivery. With acked
// non-nil, a successful job whose delivery is an [AsyncAcker] is acked in
// the background: process returns at once with async true, and the ack's
// outcome is sent to acked (asyncs counting it until then), where
// finishAsync reports it; the returned Settlement then lacks its Err.
// stopping is the Run's drain-deadline flag (see Run), nil for Process: a
// handler started once it is set starts cancelled.
func (w *Worker) process(base context.Context, t *task, acked chan<- *asyncAck, asyncs *sync.WaitGroup, stopping *atomic.Bool) (s Settlement, async bool) {
	d := t.d
	m := d.Message()
	t.hc.parent = base
	if m.CorrelationID != "" {
		t.hc.corr = &m.CorrelationID
	}
	if w.timeoutTick > 0 { // a timeout may apply: Deadline looks it up when asked
		t.hc.w, t.hc.t = w, t
	}
	var ctx context.Context = &t.hc
	defer func() {
		if !async {
			t.hc.cancel(nil)
		}
	}()
	t.mu.Lock()
	t.begun = true
	t.mu.Unlock()
	// Checked after publishing begun: either the heartbeat or the drain sees
	// it, or this sees their flag.
	if t.lost.Load() {
		t.hc.cancel(ErrLeaseLost)
	}
	if stopping != nil && stopping.Load() {
		t.hc.cancel(ErrShutdown)
	}
	// A handler (or an observer's Start) that calls runtime.Goexit ends
	// this goroutine: recover sees nothing, and nothing after call runs.
	// goexit is cleared once call returns, so the deferred goexited
	// settles the delivery only then.
	observed := len(w.opts.Observers) > 0
	var start time.Duration
	goexit := true
	defer func() {
		if goexit {
			w.goexited(base, ctx, t, start, observed)
		}
	}()
	for _, ob := range w.opts.Observers {
		ctx = w.observeStart(ctx, ob, d)
	}
	if len(w.leaseOb) > 0 {
		t.mu.Lock()
		t.ctx = ctx
		t.mu.Unlock()
	}

	// Duration is for observers, read on the monotonic clock alone (see
	// monoNow): two wall-clock reads a message cost 50 ns more on kvm-clock.
	if observed {
		start = monoNow()
	}
	err := w.call(ctx, d)
	goexit = false
	t.settling.Store(true) // an extension racing the settlement would only report a false loss
	endMono := monoNow()
	lost := t.lost.Load()
	if aa, ok := d.(AsyncAcker); ok && acked != nil && err == nil && !lost {
		a := &asyncAck{t: t, ctx: ctx, s: Settlement{Action: ActionAck, Class: Classify(nil)}}
		if observed {
			a.s.Duration = endMono - start
			a.s.Received = time.Unix(0, t.received)
		}
		s = a.s // before AckAsync: its done may run at once, writing a.s.Err
		asyncs.Add(1)
		w.acking.Add(1)
		t.acking.Store(true) // the heartbeat keeps the lease until the ack returns
		aa.AckAsync(w.settleContext(base, endMono), func(err error) {
			t.acking.Store(false)
			a.s.Err = err
			acked <- a
		})
		return s, true
	}
	s = w.settle(w.settleContext(base, endMono), ctx, d, err, lost)
	if observed {
		s.Duration = endMono - start
		s.Received = time.Unix(0, t.received)
	}
	w.settledFrom(ctx, 0, d, s)
	return s, false
}

// goexited settles t, whose handler (or an observer's Start) called
// runtime.Goexit, as process
// settles a handler panic: a *PanicError of [ErrGoexit], logged at ERROR
// and reported to the observers. It runs in process's deferred calls while
// Goexit ends the goroutine; Run's handler goroutine then frees t's slot and
// starts its replacement.
func (w *Worker) goexited(base, ctx context.Context, t *task, start time.Duration, observed bool) {
	t.settling.Store(true)
	endMono := monoNow()
	d := t.d
	m := d.Message()
	err := &PanicError{Value: ErrGoexit, Stack: debug.Stack()}
	w.opts.Logger.ErrorContext(ctx, "berth: handler called runtime.Goexit", "queue", w.opts.Queue, LogText("id", m.ID),
		LogText("type", m.Type), LogText("correlation_id", m.CorrelationID), "stack", string(err.Stack))
	s := w.settle(w.settleContext(base, endMono), ctx, d, err, t.lost.Load())
	if observed {
		if start != 0 { // 0: an observer's Start called Goexit, the handler never ran
			s.Duration = endMono - start
		}
		s.Received = time.Unix(0, t.received)
	}
	w.settledFrom(ctx, 0, d, s)
}

// observeStart calls ob.Start. Observers are user code called on the
// Worker's goroutines, where a panic would end the process (and, on the
// background-ack goroutine, leave slots held): a panic is logged
// (observerPanic) and processing goes on with ctx, as if Start had returned
// it. The cost is an open-coded defer and a call that is no longer inlined:
// a few nanoseconds an observer a message, no allocation.
func (w *Worker) observeStart(ctx context.Context, ob Observer, d Delivery) (out context.Context) {
	defer func() {
		if r := recover(); r != nil {
			w.observerPanic(ctx, ob, "Start", d, r)
			out = ctx
		}
	}()
	if out = ob.Start(ctx, d); out == nil {
		// A bug of the observer's: the handler and the observers after it
		// would fail on a nil context. Go on with the one it was given,
		// as after a panic, and say so once per Worker.
		if w.nilStart.CompareAndSwap(false, true) {
			m := d.Message()
			w.opts.Logger.ErrorContext(ctx, "berth: observer Start returned a nil context; the context it was given is used (logged once)",
				"queue", w.opts.Queue, "observer", fmt.Sprintf("%T", ob), LogText("id", m.ID), LogText("type", m.Type))
		}
		return ctx
	}
	return out
}

// observeSettled calls ob.Settled, recovering a panic as observeStart does.
func (w *Worker) observeSettled(ctx context.Context, ob Observer, d Delivery, s Settlement) {
	defer func() {
		if r := recover(); r != nil {
			w.observerPanic(ctx, ob, "Settled", d, r)
		}
	}()
	ob.Settled(ctx, d, s)
}

// settledFrom tells the observers from the i-th on of settlement s. An
// observer whose Settled calls runtime.Goexit ends the goroutine (recover
// sees nothing): the deferred call still tells the observers after it,
// which saw the delivery start, before the goroutine ends.
func (w *Worker) settledFrom(ctx context.Context, i int, d Delivery, s Settlement) {
	obs := w.opts.Observers
	if i >= len(obs) {
		return
	}
	defer func() {
		if i < len(obs) { // obs[i].Settled called runtime.Goexit
			w.settledFrom(ctx, i+1, d, s)
		}
	}()
	for ; i < len(obs); i++ {
		w.observeSettled(ctx, obs[i], d, s)
	}
}

// observeLease calls lo.LeaseExtended, recovering a panic as observeStart
// does: the heartbeat then acts on err as if the observer had returned.
func (w *Worker) observeLease(ctx context.Context, lo LeaseObserver, d Delivery, by time.Duration, err error) {
	defer func() {
		if r := recover(); r != nil {
			w.observerPanic(ctx, lo, "LeaseExtended", d, r)
		}
	}()
	lo.LeaseExtended(ctx, d, by, err)
}

// observerPanic logs the panic r of ob's method at ERROR, with ob's type and
// the delivery. r is untrusted: it is logged as sanitized text (see
// panicText).
func (w *Worker) observerPanic(ctx context.Context, ob any, method string, d Delivery, r any) {
	m := d.Message()
	w.opts.Logger.ErrorContext(ctx, "berth: observer panic; ignored", "queue", w.opts.Queue, "observer", fmt.Sprintf("%T", ob),
		"method", method, LogText("id", m.ID), LogText("type", m.Type), "panic", panicText(r), "stack", string(debug.Stack()))
}

// panicText is r as sanitized text. fmt.Sprint survives a String or Error
// method that panics, but re-panics when printing that panic's value panics
// too: such a value is named by its type, so that formatting it in a
// recovering defer cannot panic again.
func panicText(r any) (s string) {
	defer func() {
		if recover() != nil {
			s = fmt.Sprintf("%T (unprintable: its String or Error method panics)", r)
		}
	}()
	return SanitizeReason(fmt.Sprint(r))
}

func (w *Worker) call(ctx context.Context, d Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
			m := d.Message()
			w.opts.Logger.ErrorContext(ctx, "berth: handler panic", "queue", w.opts.Queue, LogText("id", m.ID),
				LogText("type", m.Type), LogText("correlation_id", m.CorrelationID), "panic", panicText(r), "stack", string(err.(*PanicError).Stack))
		}
	}()
	return printable(w.handler.Handle(ctx, d))
}

// printable returns err, or, when its Error method panics — a handler that
// returned a typed nil pointer as its error (var e *MyError; return e) —
// an error naming its type in its place. Brokers, observers and logs call
// Error on a handler's cause while settling it, where nothing recovers: the
// panic ended the process. The replacement does not wrap err (its Is, As
// or classification methods would panic as well): the job is retried as an
// unclassified failure, then dead-lettered, with that text as its reason.
func printable(err error) (out error) {
	if err == nil {
		return nil
	}
	defer func() {
		if recover() != nil {
			out = fmt.Errorf("berth: the handler returned a %T whose Error method panics (a nil pointer returned as an error?)", err)
		}
	}()
	_ = err.Error()
	return err
}

// settleContext returns a context for settlements made at now (on the
// monoNow clock), bounded by
// about SettleTimeout (see settleCtx).
func (w *Worker) settleContext(base context.Context, now time.Duration) context.Context {
	if pc, ok := base.(*processCtx); ok {
		if pc.settle == nil { // Process settles once, on its own goroutine
			pc.settle, pc.cancel = context.WithDeadline(context.WithoutCancel(base), clockEpoch.Add(now+w.opts.SettleTimeout))
		}
		return pc.settle
	}
	if sc := w.shared.Load(); sc != nil && now < sc.refreshAfter {
		return sc.ctx
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(base), clockEpoch.Add(now+w.opts.SettleTimeout))
	next := &settleCtx{ctx: ctx, cancel: cancel, refreshAfter: now + w.opts.SettleTimeout/10}
	// The replaced context is not cancelled: settlements may still use it;
	// its timer releases it at its deadline.
	w.shared.Store(next)
	return ctx
}

// settle applies the settlement table of the package doc, once, with ctx
// bounding the settlement call.
func (w *Worker) settle(ctx, hctx context.Context, d Delivery, err error, lost bool) Settlement {
	s := Settlement{Cause: err, Class: Classify(err)}
	if lost {
		s.Action = ActionLeaseLost
		w.logLeaseLost(hctx, d)
		return s
	}
	m := d.Message()
	switch {
	case err == nil:
		s.Action, s.Err = ActionAck, d.Ack(ctx)
	case errors.Is(context.Cause(hctx), ErrShutdown):
		s.Action = ActionRelease
		if _, ok := d.(Releaser); !ok {
			s.Action = ActionRetry // handed back by Retry: an attempt is consumed
		}
		s.Err = releaseOrRetry(ctx, d, 0, err)
	case errors.Is(context.Cause(hctx), ErrJobTimeout):
		// The timeout wins over what the interrupted handler returned: it
		// is a transient failure of this attempt.
		err = fmt.Errorf("%w after %s: %v", ErrJobTimeout, w.timeout(m.Type), err)
		s.Cause, s.Class = err, Classify(err)
		s.Action, s.Delay, s.Err = w.retryOrDeadLetter(ctx, d, err)
	case s.Class == ClassPermanent:
		s.Action, s.Err = ActionDeadLetter, d.DeadLetter(ctx, err)
	case s.Class == ClassRetryAfter: // not a panic's value (Classify)
		ra := retryAfter(err)
		s.Action, s.Delay = ActionRelease, min(ra.Delay, MaxDelay) // what every broker applies
		if _, ok := d.(Releaser); !ok {
			if w.atBrokerCap(d) {
				// A Retry would be the broker's last delivery spent: it
				// would dead-letter the job itself, without this error.
				s.Action, s.Delay, s.Err = ActionDeadLetter, 0, d.DeadLetter(ctx, err)
				break
			}
			s.Action = ActionRetry
		}
		s.Err = releaseOrRetry(ctx, d, s.Delay, err)
	default:
		s.Action, s.Delay, s.Err = w.retryOrDeadLetter(ctx, d, err)
	}
	w.log(hctx, d, s)
	return s
}

// retryAfter returns the *RetryAfterError in err's chain, or nil. A
// function of its own so that the variable errors.As needs escapes only on
// this failure path, not for every acked message.
func retryAfter(err error) *RetryAfterError {
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		return ra
	}
	return nil
}

// atBrokerCap reports whether d's attempt is the last the broker's poison
// cap allows.
func (w *Worker) atBrokerCap(d Delivery) bool {
	return w.maxAttempts > 0 && d.Attempt() >= w.maxAttempts
}

// retryOrDeadLetter settles a transient failure: Retry with backoff while
// the type's policy allows another attempt, else DeadLetter. The broker's
// poison cap bounds the policy: at the broker's last delivery the Worker
// dead-letters itself, so the dead letter carries the handler's error.
func (w *Worker) retryOrDeadLetter(ctx context.Context, d Delivery, cause error) (Action, time.Duration, error) {
	p := w.opts.Retry
	if tp, ok := w.opts.RetryByType[d.Message().Type]; ok {
		p = tp
	}
	if d.Attempt() < p.MaxAttempts && !w.atBrokerCap(d) {
		// At most MaxDelay, which every broker applies to a longer one: the
		// Settlement reports the delay the broker keeps.
		delay := min(p.Backoff.Delay(d.Attempt(), w.rand()), MaxDelay)
		return ActionRetry, delay, d.Retry(ctx, delay, cause)
	}
	return ActionDeadLetter, 0, d.DeadLetter(ctx, cause)
}

// timeout is the handler timeout of jobType, 0 for none.
func (w *Worker) timeout(jobType string) time.Duration {
	d := w.opts.Timeout
	if td, ok := w.opts.TimeoutByType[jobType]; ok {
		d = td
	}
	return max(d, 0)
}

func releaseOrRetry(ctx context.Context, d Delivery, delay time.Duration, cause error) error {
	if r, ok := d.(Releaser); ok {
		return r.Release(ctx, delay)
	}
	return d.Retry(ctx, delay, cause)
}

func (w *Worker) release(base context.Context, d Delivery, why string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(base), w.opts.SettleTimeout)
	defer cancel()
	if err := releaseOrRetry(ctx, d, 0, ErrShutdown); err != nil {
		m := d.Message()
		w.opts.Logger.WarnContext(ctx, "berth: release failed; the delivery returns after its lease",
			"queue", w.opts.Queue, LogText("id", m.ID), LogText("correlation_id", m.CorrelationID), "why", why, "err", err)
	}
}

func (w *Worker) rand() float64 {
	w.randMu.Lock()
	defer w.randMu.Unlock()
	return w.opts.Rand.Float64()
}

func (w *Worker) logLeaseLost(ctx context.Context, d Delivery) {
	m := d.Message()
	w.opts.Logger.WarnContext(ctx, "berth: lease lost; not settling (another consumer may own the delivery)",
		"queue", w.opts.Queue, LogText("id", m.ID), LogText("type", m.Type), LogText("correlation_id", m.CorrelationID), "attempt", d.Attempt())
}

// log records a settlement with the handler's context, so that a context-aware
// slog.Handler (telemetry's) adds trace and correlation IDs.
func (w *Worker) log(ctx context.Context, d Delivery, s Settlement) {
	l := w.opts.Logger
	level := slog.LevelDebug
	switch {
	case s.Err != nil:
		level = slog.LevelWarn
	case s.Action == ActionDeadLetter:
		level = slog.LevelWarn
	case s.Action == ActionRetry || s.Action == ActionRelease:
		level = slog.LevelInfo
	}
	if !l.Enabled(ctx, level) {
		return
	}
	m := d.Message()
	attrs := []slog.Attr{
		slog.String("queue", w.opts.Queue), LogText("id", m.ID), LogText("type", m.Type),
		slog.Int("attempt", d.Attempt()), slog.String("action", string(s.Action)),
	}
	if m.CorrelationID != "" {
		attrs = append(attrs, LogText("correlation_id", m.CorrelationID))
	}
	if s.Cause != nil {
		attrs = append(attrs, slog.String("class", string(s.Class)), LogCause("cause", s.Cause))
	}
	if s.Delay > 0 {
		attrs = append(attrs, slog.Duration("delay", s.Delay))
	}
	if s.Err != nil {
		attrs = append(attrs, slog.Any("settle_err", s.Err))
	}
	l.LogAttrs(ctx, level, "berth: settled", attrs...)
}
