package sdk

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// handlerCtx is the context a handler runs under: cancellable with a cause
// (lease lost, shutdown, job timeout, and context.Canceled when the handler
// returns), as context.WithCancelCause makes, but living inside the task
// record. context.WithCancelCause cost two allocations, and its cancel a
// mutex and an atomic.Value store plus its bookkeeping, for every message —
// a fifth of the Worker's own time on the memory broker — while almost no
// handler ever waits on its context.
//
// It keeps the standard behaviour: [context.Cause] returns the cause (Value
// answers the key Cause asks with a cancelled standard context carrying it,
// made only when asked), and contexts derived from it are cancelled with it
// through the AfterFunc method the context package looks for (no goroutine
// per child), synchronously, as children of a standard context are.
//
// Err is context.DeadlineExceeded when the cause is the job timeout
// ([ErrJobTimeout]), context.Canceled otherwise, and Deadline is the job's
// deadline when a timeout applies (see Deadline): the context reads as one
// made by context.WithDeadline, which is what handlers and drivers that
// map ctx.Err to a timeout error (database and HTTP clients) expect.
type handlerCtx struct {
	parent context.Context // never cancelled (the Worker's detached base)
	corr   *string         // the delivery's correlation ID, answered for correlationKey; nil for none
	// done points at the done channel, made by the first Done, or at
	// closedChan when cancel came first. A typed pointer rather than an
	// atomic.Value: a fresh atomic.Value's first Store takes its slow path
	// (pinning the P to publish the type), and every handler context is
	// fresh — 2 % of the memory Worker's CPU, for the cancel at the end of
	// every handler.
	done atomic.Pointer[chan struct{}]
	// w and t are the Worker and the task whose handler c is the context
	// of, for Deadline; nil when no timeout can apply.
	w *Worker
	t *task

	mu    sync.Mutex
	cause error     // non-nil once cancelled; written once, before done is closed or stored
	after []*func() // callbacks registered by AfterFunc, not yet run or stopped
}

// closedChan is the done channel of a context cancelled before anyone asked
// for it.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Deadline is the earlier of the parent's deadline and the job's, when a
// timeout applies to the job's type: the time from which its timeout counts
// plus the timeout. The timeout counts from when the watchdog first saw the
// handler run (see Worker.watchdog), or, asked before that, from the first
// call to Deadline, which the watchdog then counts from too: the deadline
// given is the one enforced (within the watchdog's precision, up to a tick
// after it). It costs nothing per job until a handler asks.
func (c *handlerCtx) Deadline() (time.Time, bool) {
	pd, ok := c.parent.Deadline()
	if c.w == nil || c.t == nil {
		return pd, ok
	}
	timeout := c.w.timeout(c.t.d.Message().Type)
	if timeout <= 0 {
		return pd, ok
	}
	c.t.mu.Lock()
	if c.t.started == 0 {
		c.t.started = time.Now().UnixNano()
	}
	jd := time.Unix(0, c.t.started).Add(timeout)
	c.t.mu.Unlock()
	if ok && pd.Before(jd) {
		return pd, true
	}
	return jd, true
}

func (c *handlerCtx) Done() <-chan struct{} {
	if d := c.done.Load(); d != nil {
		return *d
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.done.Load(); d != nil {
		return *d
	}
	d := make(chan struct{})
	c.done.Store(&d)
	return d
}

func (c *handlerCtx) Err() error {
	// cancel stores or closes done before it returns: a closed done is the
	// cancellation, as in the context package (Err is not nil before Done
	// is closed).
	d := c.done.Load()
	if d == nil {
		return nil
	}
	select {
	case <-*d:
		// cause was written, for good, before done was closed or stored:
		// the receive (or the atomic load of a closed done) orders this
		// read after it, without the lock.
		if c.cause == ErrJobTimeout {
			return context.DeadlineExceeded
		}
		return context.Canceled
	default:
		return nil
	}
}

// Value answers context.Cause's key with a cancelled standard context
// carrying the cause (nil before cancellation: the parent has none; made at
// each call, as Cause is asked only on failure paths), correlationKey with
// the delivery's correlation ID, and every other key from the parent.
func (c *handlerCtx) Value(key any) any {
	if key == cancelCauseKey && cancelCauseKey != nil {
		c.mu.Lock()
		cause := c.cause
		c.mu.Unlock()
		if cause == nil {
			return nil
		}
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		return ctx.Value(key)
	}
	if _, ok := key.(correlationKey); ok && c.corr != nil {
		return c.corr
	}
	return c.parent.Value(key)
}

func (c *handlerCtx) String() string { return "berth.handlerCtx" }

// AfterFunc arranges for f to be called once c is cancelled; the context
// package uses it to cancel contexts derived from c. The returned function
// stops the call, reporting whether it did.
func (c *handlerCtx) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	if c.cause != nil {
		c.mu.Unlock()
		go f() // the caller may hold a lock f takes
		return func() bool { return false }
	}
	p := &f
	c.after = append(c.after, p)
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, q := range c.after {
			if q == p {
				c.after = append(c.after[:i], c.after[i+1:]...)
				return true
			}
		}
		return false
	}
}

// cancel cancels c with cause (context.Canceled when nil), once, and calls
// the AfterFunc callbacks. Err is then context.DeadlineExceeded when cause
// is the job timeout ([ErrJobTimeout]), context.Canceled otherwise.
func (c *handlerCtx) cancel(cause error) { c.cancelUnless(cause, nil) }

// cancelUnless is cancel, except that it does nothing when unless is set,
// which it reads under c's lock: a flag set before the cancel (the handler
// returned: t.settling) wins over it, and a cancel it lets through is seen
// by every later read of the cause (context.Cause, under the same lock). It
// reports whether it cancelled c.
func (c *handlerCtx) cancelUnless(cause error, unless *atomic.Bool) bool {
	if cause == nil {
		cause = context.Canceled
	}
	c.mu.Lock()
	if c.cause != nil || (unless != nil && unless.Load()) {
		c.mu.Unlock()
		return false
	}
	c.cause = cause
	if d := c.done.Load(); d != nil {
		close(*d)
	} else {
		c.done.Store(&closedChan)
	}
	after := c.after
	c.after = nil
	c.mu.Unlock()
	for _, f := range after {
		(*f)()
	}
	return true
}
