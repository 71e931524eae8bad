package sdk

import "sync/atomic"

// runQueue hands received tasks to the Worker's handler goroutines with at
// most one goroutine wake-up under way at a time, as the Go scheduler wakes
// its spinning threads.
//
// Handler goroutines used to wait on the task channel itself, so every task
// sent woke one of them: on two cores a wake-up costs more than the Worker's
// whole per-message work, and a no-op handler's deliveries paid one each.
// Here an idle handler goroutine waits on kick instead. A batch of pushed
// tasks wakes one; a woken goroutine that takes a task and sees more wakes
// the next before running its own, so that a batch of slow jobs still
// reaches every handler goroutine (one wake-up latency apart), while short
// jobs are run by the goroutines already awake, without a wake-up each.
type runQueue struct {
	jobs chan *task    // never full: it holds one task per held slot at most
	kick chan struct{} // an idle goroutine's wake-up; holds one
	quit chan struct{} // closed after jobs is closed: idle goroutines exit
	// waking is set while a wake-up is sent and its goroutine has not yet
	// looked at jobs: no second one is sent meanwhile.
	waking atomic.Bool
	// queued counts the tasks pushed and not yet taken (raised before the
	// send). A taker asks it, not len(jobs), whether work is left: len is
	// a plain read, which on a weakly ordered CPU (arm64) may be done
	// before the taker's store to waking is visible, while a push that
	// saw waking still set sent no wake-up. Atomics are sequentially
	// consistent: either the push sees waking cleared and wakes, or the
	// taker sees the pushed task counted.
	queued atomic.Int64
}

func newRunQueue(capacity int) *runQueue {
	return &runQueue{jobs: make(chan *task, capacity), kick: make(chan struct{}, 1), quit: make(chan struct{})}
}

// push queues t; the caller calls wakeOne after its batch.
func (r *runQueue) push(t *task) {
	r.queued.Add(1)
	r.jobs <- t
}

// wakeOne wakes an idle handler goroutine unless a wake-up is under way.
func (r *runQueue) wakeOne() {
	if r.waking.CompareAndSwap(false, true) {
		select {
		case r.kick <- struct{}{}:
		default: // a wake-up is already waiting to be taken
		}
	}
}

// close ends the queue: tasks still in it are taken, then next returns false.
func (r *runQueue) close() {
	close(r.jobs)
	close(r.quit)
}

// take returns a queued task without waiting; false when none is queued.
func (r *runQueue) take() (*task, bool) {
	select {
	case t, ok := <-r.jobs:
		if ok {
			r.queued.Add(-1)
		}
		return t, ok
	default:
		return nil, false
	}
}

// taker is one handler goroutine's side of a runQueue.
type taker struct {
	r     *runQueue
	woken bool // this goroutine took the wake-up under way
}

// next returns the next task, waiting for one; false once the queue is
// closed and empty.
func (k *taker) next() (*task, bool) {
	r := k.r
	for {
		select {
		case t, ok := <-r.jobs:
			if !ok {
				return nil, false
			}
			r.queued.Add(-1)
			if k.woken {
				k.woken = false
				r.waking.Store(false)
			}
			if r.queued.Load() > 0 {
				r.wakeOne() // more to run: another goroutine helps
			}
			return t, true
		default:
		}
		if k.woken {
			// Woken for a task another goroutine took: end the wake-up,
			// then look again, since a push that saw it under way sent none.
			k.woken = false
			r.waking.Store(false)
			continue
		}
		select {
		case <-r.kick:
			k.woken = true
		case <-r.quit:
		}
	}
}
