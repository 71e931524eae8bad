package sdk

import (
	"sync"
	"sync/atomic"
	"time"
)

// WorkerState is where a Worker is in its life, as [Worker.Health] reports it.
type WorkerState string

// The states of a Worker.
const (
	// StateIdle: Run has not been called yet.
	StateIdle WorkerState = "idle"
	// StateRunning: Run receives and handles deliveries.
	StateRunning WorkerState = "running"
	// StateDraining: Run's context ended (or the broker failed for good);
	// it no longer receives and waits for running handlers.
	StateDraining WorkerState = "draining"
	// StateStopped: Run returned. Calling Run again makes it running.
	StateStopped WorkerState = "stopped"
)

// HealthyWait is how long a Receive call must have waited without failing
// for a Worker whose previous Receive failed to be ready again. Brokers
// long-poll: on an idle queue a healthy Receive may wait for a message for
// ever (memory, PostgreSQL, RabbitMQ) or for its poll window (SQS,
// JetStream), while a broker that is down fails a Receive at once (refused
// connection) or within its poll interval. So a Receive that has waited this
// long without an error is taken as working, and one that returned without an
// error is proof.
const HealthyWait = 5 * time.Second

// ConnectionReporter is implemented by brokers that keep a connection and
// reconnect by themselves (RabbitMQ, JetStream). On such a broker a Receive
// may wait through an outage instead of failing (RabbitMQ's does), and a
// Worker would look ready while its broker is gone; with it, [Worker.Health]
// is not ready while the connection is down. Health calls it on every
// check, so it must be cheap (no network call).
type ConnectionReporter interface {
	// ConnectionError returns nil while the connection the broker receives
	// on is up, else why it is down.
	ConnectionError() error
}

// Health is a snapshot of a Worker's liveness and readiness ([Worker.Health]).
// Its JSON form is what package health serves.
//
// Live: the Worker's run loop is alive — Run has not been called yet or has
// not returned (State idle, running or draining). A Worker whose Run returned
// (the broker was closed, the queue is missing, the context ended) is not
// live: the process should restart it or exit.
//
// Ready: the Worker is taking work — State is running, its broker reports
// no connection error (where it is a [ConnectionReporter]), and on each of
// its queues not paused the last Receive did not fail, or a Receive started
// since that failure has waited [HealthyWait] without failing (with several
// receive loops, one started before the failure does not count; with
// several queues, the Receives cut off empty at QueueIdleWait since the
// failure count as one wait, from the first one's start). A
// draining Worker is not ready: it takes no more work. A saturated Worker
// (Held == Capacity, every slot busy) is still ready: it receives again as
// soon as a handler returns.
type Health struct {
	// Queue is the queue the Worker consumes (its Queues joined by commas).
	Queue string `json:"queue"`
	// Paused lists the queues paused in this Worker ([Worker.Pause]); a
	// paused queue does not make the Worker unready.
	Paused []string `json:"paused,omitempty"`
	// State is where the Worker is in its life.
	State WorkerState `json:"state"`
	// Live and Ready are described on [Health].
	Live  bool `json:"live"`
	Ready bool `json:"ready"`
	// Reason says why the Worker is not ready (or not live), else "".
	Reason string `json:"reason,omitempty"`
	// Receiving is true while the receive loop runs (State running).
	Receiving bool `json:"receiving"`
	// LastReceive is when a Receive last returned without an error (a long
	// poll that ended empty counts; a Receive the Worker cut off at
	// QueueIdleWait does not); zero before the first.
	LastReceive time.Time `json:"last_receive,omitzero"`
	// ReceiveFailures counts the Receive calls that failed since the last
	// one that returned without an error, on each queue, summed.
	ReceiveFailures int `json:"receive_failures"`
	// LastReceiveError is the error of the last failed Receive (valid UTF-8,
	// at most [MaxReasonLength] bytes), and LastReceiveErrorAt its time; kept
	// after recovery, as evidence.
	LastReceiveError   string    `json:"last_receive_error,omitempty"`
	LastReceiveErrorAt time.Time `json:"last_receive_error_at,omitzero"`
	// Held counts deliveries received and not yet settled: running handlers
	// plus prefetched deliveries waiting for one. Capacity is the most it
	// can be (Concurrency + Prefetch).
	Held     int `json:"held"`
	Capacity int `json:"capacity"`
	// RunError is the error Run returned last, if any.
	RunError string `json:"run_error,omitempty"`
}

// Worker states as stored in workerHealth.state.
const (
	hIdle int32 = iota
	hRunning
	hDraining
	hStopped
)

var stateNames = [...]WorkerState{hIdle: StateIdle, hRunning: StateRunning, hDraining: StateDraining, hStopped: StateStopped}

// workerHealth is what the Worker records for [Worker.Health]: atomics on
// the receive path (one clock read and a few stores per Receive call, one
// atomic add per delivery), a mutex only on the error paths. Whether
// Receives are failing is kept per queue (queueHealth): on a Worker of
// several queues, one queue's successes say nothing of another's failures.
type workerHealth struct {
	state  atomic.Int32
	held   atomic.Int64
	recvOK atomic.Int64 // unix nanos of the last Receive without error

	mu        sync.Mutex
	recvErr   string
	recvErrAt time.Time
	runErr    string
}

// queueHealth is one consumed queue's part of the Worker's health, shared by
// the receive loops of that queue.
type queueHealth struct {
	// recvCall is when the latest Receive under way started (unix nanos);
	// 0 when none, or when it started before the queue's last failure.
	recvCall atomic.Int64
	failures atomic.Int32 // failed Receives since the last one without error
	// slotWait is when the queue's loop, with failures on record, began
	// waiting for a slot from the allocator (several queues only); 0 when
	// it is not waiting. A queue whose slots all go to other queues (a
	// higher Priority with work, every slot held) makes no Receive that
	// could clear its failures: it is not receiving by the allocator's
	// choice, and counts as failing no longer than HealthyWait.
	slotWait atomic.Int64
	// idleSince is when the first of the Receives cut off at QueueIdleWait
	// (several queues) since the queue's last failure started; 0 when none
	// or without failures on record. Cut-offs in a row are one long wait
	// without failing, as a single queue's Receive waiting that long.
	idleSince atomic.Int64
	lastErr   string // the queue's last Receive error; under workerHealth.mu
}

// waitingForSlot records that q's loop waits for a slot from now on (zero:
// it got one). It reads the clock only when q has failures on record.
func (q *queueHealth) waitingForSlot(waiting bool) {
	switch {
	case !waiting:
		if q.slotWait.Load() != 0 {
			q.slotWait.Store(0)
		}
	case q.failures.Load() != 0:
		q.slotWait.Store(time.Now().UnixNano())
	}
}

// receiving records that a Receive call on q starts at now (unix nanos).
func (h *workerHealth) receiving(q *queueHealth, now int64) { q.recvCall.Store(now) }

// idle records that the Receive call on q that started at start was cut off
// empty at QueueIdleWait (a Worker of several queues, receiveBounded). That
// is neither a success nor a failure: the call did not return by itself
// (LastReceive is not moved, failures on record stay), but it did not fail
// for QueueIdleWait, and cut-offs in a row since a failure make the queue
// ready again once they span HealthyWait, as a single queue's Receive does
// by waiting that long. Counting each as a success made a queue ready
// QueueIdleWait after any failure and cleared its failure count, although
// the broker had proved nothing.
func (h *workerHealth) idle(q *queueHealth, start int64) {
	// idleSince first, then the call's end: a probe between the two sees
	// the wait either as the call in flight or as the idle span, both from
	// start, never as neither (not ready for an instant).
	if q.failures.Load() != 0 && q.idleSince.Load() == 0 {
		q.idleSince.Store(start) // one receive loop per queue with several queues
	}
	q.recvCall.CompareAndSwap(start, 0)
}

// received records the outcome of the Receive call on q that started at
// start and ended at now with n deliveries. A Receive cut short by shutdown
// or a pause (stopping) is neither a success nor a failure.
func (h *workerHealth) received(q *queueHealth, start, now int64, n int, err error, stopping bool) {
	// Only this call's start: another loop's call on q may be under way.
	q.recvCall.CompareAndSwap(start, 0)
	if n > 0 {
		h.held.Add(int64(n))
	}
	if stopping {
		return
	}
	if err == nil {
		h.recvOK.Store(now)
		if q.failures.Load() != 0 {
			q.failures.Store(0)
			q.idleSince.Store(0)
		}
		return
	}
	q.idleSince.Store(0)
	// A Receive of another loop that started before this failure is no
	// Receive "under way since the failure": its wait, mostly before the
	// failure, says nothing of the broker since. recvCall holds the latest
	// start, so when that is no later than the failure, none counts.
	for cur := q.recvCall.Load(); cur != 0 && cur <= now && !q.recvCall.CompareAndSwap(cur, 0); cur = q.recvCall.Load() {
	}
	h.mu.Lock()
	h.recvErr = SanitizeReason(err.Error())
	h.recvErrAt = time.Unix(0, now)
	q.lastErr = h.recvErr
	h.mu.Unlock()
	q.failures.Add(1)
}

// start records that Run started, on queues.
func (h *workerHealth) start(queues []*queueState) {
	for _, q := range queues {
		q.health.failures.Store(0)
		q.health.recvCall.Store(0)
		q.health.slotWait.Store(0)
		q.health.idleSince.Store(0)
	}
	h.mu.Lock()
	for _, q := range queues {
		q.health.lastErr = ""
	}
	h.runErr = ""
	h.mu.Unlock()
	h.state.Store(hRunning)
}

// stop records that Run returned err.
func (h *workerHealth) stop(err error) {
	h.mu.Lock()
	h.runErr = ""
	if err != nil {
		h.runErr = SanitizeReason(err.Error())
	}
	h.mu.Unlock()
	h.state.Store(hStopped)
}

// Health reports the Worker's liveness and readiness and what they are
// made of (see [Health]). It is cheap (a few atomic loads and a mutex) and
// safe to call at any time from any goroutine, e.g. from an HTTP probe.
func (w *Worker) Health() Health {
	h := &w.health
	now := time.Now()
	st := h.state.Load()
	r := Health{
		Queue:     w.opts.Queue,
		State:     stateNames[st],
		Receiving: st == hRunning,
		Held:      int(h.held.Load()),
		Capacity:  w.opts.Concurrency + w.opts.Prefetch,
	}
	// Receiving is failing when one queue not paused has failed and no
	// Receive on it under way has waited HealthyWait since.
	var failing *queueState
	for _, q := range w.queues {
		f := int(q.health.failures.Load())
		r.ReceiveFailures += f
		if q.paused.Load() {
			r.Paused = append(r.Paused, q.name)
			continue
		}
		waited := func(since int64) bool { return since != 0 && now.Sub(time.Unix(0, since)) >= HealthyWait }
		if f != 0 && !waited(q.health.recvCall.Load()) && !waited(q.health.slotWait.Load()) && !waited(q.health.idleSince.Load()) {
			if failing == nil {
				failing = q
			}
		}
	}
	if ok := h.recvOK.Load(); ok != 0 {
		r.LastReceive = time.Unix(0, ok)
	}
	h.mu.Lock()
	r.LastReceiveError, r.LastReceiveErrorAt, r.RunError = h.recvErr, h.recvErrAt, h.runErr
	var failingErr string
	if failing != nil {
		failingErr = failing.health.lastErr
	}
	h.mu.Unlock()

	r.Live = st != hStopped
	switch st {
	case hIdle:
		r.Reason = "not started: Run has not been called"
	case hDraining:
		r.Reason = "draining: no longer receiving"
	case hStopped:
		r.Reason = "stopped: Run returned"
		if r.RunError != "" {
			r.Reason += ": " + r.RunError
		}
	case hRunning:
		var connErr error
		if cr, ok := w.sub.(ConnectionReporter); ok {
			connErr = cr.ConnectionError()
		}
		switch {
		case connErr != nil:
			r.Reason = "broker connection down: " + SanitizeReason(connErr.Error())
		case failing == nil:
			r.Ready = true
		default:
			// The failing queue's own error: LastReceiveError may be
			// another queue's.
			r.Reason = "receive failing: " + failingErr
			if len(w.queues) > 1 {
				r.Reason = "receive failing on " + failing.name + ": " + failingErr
			}
		}
	}
	return r
}
