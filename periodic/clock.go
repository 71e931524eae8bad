package periodic

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Clock is the scheduler's time: [RealClock] in programs, a [FakeClock] in
// tests that run hours of schedule in milliseconds.
type Clock interface {
	Now() time.Time
	// Sleep waits for d or until ctx is done, and returns ctx.Err() then.
	Sleep(ctx context.Context, d time.Duration) error
}

// RealClock is the system clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// Sleep waits for d or ctx.
func (RealClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// FakeClock is a manual clock for tests: time moves only with Advance, and
// Sleep returns when Advance moves the time past its end. WaitSleepers lets
// a test wait until every scheduler has finished its work and sleeps, so
// that each Advance is deterministic.
//
// A [Scheduler] on a FakeClock counts its work on the clock: its Run loop
// while it does not sleep, and each publish it has started until Run has
// taken its result. A publish is not work while the publisher sleeps on
// the clock with the context Publish was given (a test's publisher that
// hangs in fake time): it waits on what the test controls. The
// scheduler's Options.PublishTimeout is a timer on the clock, not a
// sleeper: an Advance past it ends the publish's context (Err
// context.DeadlineExceeded) before it returns, and the publish is work
// again until Run has taken its failure. A Clock that wraps a FakeClock
// (to make its Now jump, say) should embed it, so that the scheduler
// still finds it and counts its work.
type FakeClock struct {
	mu       sync.Mutex
	now      time.Time
	sleepers []*sleeper
	busy     int           // work in progress (see work)
	changed  chan struct{} // closed and replaced whenever sleepers or busy change
}

type sleeper struct {
	until time.Time
	wake  chan struct{}
	work  *work // the work that sleeps, or nil; for a timer, the work it wakes
	// fire, for a timer (see timeout), ends its context; nil for a Sleep.
	// A timer is not a goroutine that sleeps: Sleepers and WaitSleepers
	// do not count it.
	fire func()
}

// work is a unit of a scheduler's work on a FakeClock (its Run loop, one
// publish): busy, it holds WaitSleepers back, except while it sleeps on
// the clock (a Sleep whose context carries it, see withWork).
type work struct {
	c     *FakeClock
	busy  bool // guarded by c.mu
	ended bool // guarded by c.mu
}

// workClock is a Clock that counts a scheduler's work: a *FakeClock, or a
// Clock that embeds one.
type workClock interface {
	beginWork() *work
	timeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc)
}

// beginWork starts a busy unit of work.
func (c *FakeClock) beginWork() *work {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.busy++
	c.notifyLocked()
	return &work{c: c, busy: true}
}

// end ends w: it no longer holds WaitSleepers back. A nil w (a clock that
// counts no work) is a no-op.
func (w *work) end() {
	if w == nil {
		return
	}
	c := w.c
	c.mu.Lock()
	defer c.mu.Unlock()
	w.ended = true
	if w.busy {
		w.busy = false
		c.busy--
		c.notifyLocked()
	}
}

type workKey struct{}

// withWork returns ctx carrying w, so that a Sleep on w's clock with it
// (or a context derived from it) makes w idle while it sleeps.
func withWork(ctx context.Context, w *work) context.Context {
	if w == nil {
		return ctx
	}
	return context.WithValue(ctx, workKey{}, w)
}

// wakeLocked makes the work of s busy again as it stops sleeping.
func (c *FakeClock) wakeLocked(s *sleeper) {
	if s.work != nil && !s.work.ended && !s.work.busy {
		s.work.busy = true
		c.busy++
	}
}

// NewFakeClock returns a FakeClock showing now.
func NewFakeClock(now time.Time) *FakeClock {
	return &FakeClock{now: now, changed: make(chan struct{})}
}

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep waits until Advance moves the clock d past now, or ctx is done.
func (c *FakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	if d <= 0 {
		c.mu.Unlock()
		return ctx.Err()
	}
	s := &sleeper{until: c.now.Add(d), wake: make(chan struct{})}
	if w, _ := ctx.Value(workKey{}).(*work); w != nil && w.c == c && w.busy {
		w.busy = false // it waits on the clock, which the test moves
		c.busy--
		s.work = w
	}
	c.sleepers = append(c.sleepers, s)
	c.notifyLocked()
	c.mu.Unlock()
	select {
	case <-s.wake:
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		for i, x := range c.sleepers {
			if x == s {
				c.sleepers = append(c.sleepers[:i], c.sleepers[i+1:]...)
				c.wakeLocked(s)
				c.notifyLocked()
				break
			}
		}
		c.mu.Unlock()
		return ctx.Err()
	}
}

// Advance moves the clock by d and wakes the sleepers whose time came, in
// the order of their end. It also ends the scheduler's publishes whose
// PublishTimeout it passes (their context's Err is then
// context.DeadlineExceeded), before it returns.
func (c *FakeClock) Advance(d time.Duration) {
	var fired []func()
	c.mu.Lock()
	c.now = c.now.Add(d)
	sort.SliceStable(c.sleepers, func(i, j int) bool { return c.sleepers[i].until.Before(c.sleepers[j].until) })
	kept := c.sleepers[:0]
	for _, s := range c.sleepers {
		if !s.until.After(c.now) {
			c.wakeLocked(s) // busy before Advance returns: WaitSleepers waits for it
			close(s.wake)
			if s.fire != nil {
				fired = append(fired, s.fire)
			}
		} else {
			kept = append(kept, s)
		}
	}
	clear(c.sleepers[len(kept):])
	c.sleepers = kept
	c.notifyLocked()
	c.mu.Unlock()
	// Outside c.mu: ending a context may run code that uses the clock.
	for _, f := range fired {
		f()
	}
}

// timeout returns a context derived from ctx that ends, with Err
// context.DeadlineExceeded, once Advance moves the clock d past now: the
// scheduler's PublishTimeout on the fake clock. Its timer is no sleeper
// (Sleepers and WaitSleepers do not count it); when it fires, the work ctx
// carries (the publish) is busy again before Advance returns, so that
// WaitSleepers waits for the scheduler to take the publish's failure.
func (c *FakeClock) timeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	tc := newClockCtx(ctx)
	if d <= 0 {
		tc.end(context.DeadlineExceeded)
		return tc, func() {}
	}
	w, _ := ctx.Value(workKey{}).(*work)
	if w != nil && w.c != c {
		w = nil
	}
	s := &sleeper{wake: make(chan struct{}), work: w, fire: func() { tc.end(context.DeadlineExceeded) }}
	c.mu.Lock()
	s.until = c.now.Add(d)
	c.sleepers = append(c.sleepers, s)
	c.mu.Unlock()
	return tc, func() {
		c.mu.Lock()
		for i, x := range c.sleepers {
			if x == s {
				c.sleepers = append(c.sleepers[:i], c.sleepers[i+1:]...)
				break
			}
		}
		c.mu.Unlock()
		tc.end(context.Canceled)
	}
}

// clockTimeout is timeout for a Clock that counts no work (neither
// RealClock nor a FakeClock): a goroutine sleeps d on clock, then ends the
// context with context.DeadlineExceeded. Its cancel func waits for the
// goroutine.
func clockTimeout(ctx context.Context, clock Clock, d time.Duration) (context.Context, context.CancelFunc) {
	tc := newClockCtx(ctx)
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if clock.Sleep(sctx, d) == nil {
			tc.end(context.DeadlineExceeded)
		}
	}()
	return tc, func() {
		stop()
		<-done
		tc.end(context.Canceled)
	}
}

// clockCtx is a context ended by its parent or by a timer on a Clock
// (see timeout): it reads as one made by context.WithTimeout — Err is
// context.DeadlineExceeded when the timer ended it — except that Deadline
// is the parent's, since the clock's time is not the wall clock's.
type clockCtx struct {
	parent context.Context
	done   chan struct{}
	stop   func() bool // unregisters the parent's AfterFunc
	mu     sync.Mutex
	err    error
}

func newClockCtx(parent context.Context) *clockCtx {
	c := &clockCtx{parent: parent, done: make(chan struct{})}
	// Under c.mu: with parent already done, AfterFunc runs its func at
	// once on a goroutine of its own, whose end must find stop set.
	c.mu.Lock()
	c.stop = context.AfterFunc(parent, func() { c.end(parent.Err()) })
	c.mu.Unlock()
	return c
}

// end ends c with err, unless it has ended.
func (c *clockCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	close(c.done)
	c.stop()
}

func (c *clockCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }
func (c *clockCtx) Done() <-chan struct{}       { return c.done }
func (c *clockCtx) Value(key any) any           { return c.parent.Value(key) }

func (c *clockCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Sleepers returns how many goroutines sleep on the clock now.
func (c *FakeClock) Sleepers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sleepingLocked()
}

// sleepingLocked counts the sleepers that are goroutines (not timers).
func (c *FakeClock) sleepingLocked() int {
	n := 0
	for _, s := range c.sleepers {
		if s.fire == nil {
			n++
		}
	}
	return n
}

// WaitSleepers blocks until at least n goroutines sleep on the clock and
// no scheduler on it has work in progress (see [FakeClock]), or ctx is
// done. A scheduler whose publishes have all ended, or sleep on the clock,
// and whose Run sleeps counts as one sleeper, plus one for each publisher
// sleeping on the clock (PublishTimeout timers are not counted).
func (c *FakeClock) WaitSleepers(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		got, busy, ch := c.sleepingLocked(), c.busy, c.changed
		c.mu.Unlock()
		if got >= n && busy == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *FakeClock) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}
