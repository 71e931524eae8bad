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
type handlerCtx struct {
	parent context.Context // never cancelled (the Worker's detached base)
	corr   *string         // the delivery's correlation ID, answered for correlationKey; nil for none
	done   atomic.Value    // chan struct{}, made by the first Done or by cancel (closed then)

	mu    sync.Mutex
	cause error     // non-nil once cancelled
	after []*func() // callbacks registered by AfterFunc, not yet run or stopped
}

// closedChan is the done channel of a context cancelled before anyone asked
// for it.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

func (c *handlerCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }

func (c *handlerCtx) Done() <-chan struct{} {
	if d := c.done.Load(); d != nil {
		return d.(chan struct{})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.done.Load(); d != nil {
		return d.(chan struct{})
	}
	d := make(chan struct{})
	c.done.Store(d)
	return d
}

func (c *handlerCtx) Err() error {
	// cancel stores or closes done before it returns: a closed done is the
	// cancellation, as in the context package (Err is not nil before Done
	// is closed).
	d, _ := c.done.Load().(chan struct{})
	if d == nil {
		return nil
	}
	select {
	case <-d:
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
// the AfterFunc callbacks.
func (c *handlerCtx) cancel(cause error) {
	if cause == nil {
		cause = context.Canceled
	}
	c.mu.Lock()
	if c.cause != nil {
		c.mu.Unlock()
		return
	}
	c.cause = cause
	if d, _ := c.done.Load().(chan struct{}); d != nil {
		close(d)
	} else {
		c.done.Store(closedChan)
	}
	after := c.after
	c.after = nil
	c.mu.Unlock()
	for _, f := range after {
		(*f)()
	}
}
