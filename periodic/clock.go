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
// hangs in fake time): it waits on what the test controls. A Clock that
// wraps a FakeClock (to make its Now jump, say) should embed it, so that
// the scheduler still finds it and counts its work.
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
	work  *work // the work that sleeps, or nil
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
// the order of their end.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	sort.SliceStable(c.sleepers, func(i, j int) bool { return c.sleepers[i].until.Before(c.sleepers[j].until) })
	kept := c.sleepers[:0]
	for _, s := range c.sleepers {
		if !s.until.After(c.now) {
			c.wakeLocked(s) // busy before Advance returns: WaitSleepers waits for it
			close(s.wake)
		} else {
			kept = append(kept, s)
		}
	}
	clear(c.sleepers[len(kept):])
	c.sleepers = kept
	c.notifyLocked()
}

// Sleepers returns how many goroutines sleep on the clock now.
func (c *FakeClock) Sleepers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sleepers)
}

// WaitSleepers blocks until at least n goroutines sleep on the clock and
// no scheduler on it has work in progress (see [FakeClock]), or ctx is
// done. A scheduler whose publishes have all ended, or sleep on the clock,
// and whose Run sleeps counts as one sleeper, plus one for each publisher
// sleeping on the clock.
func (c *FakeClock) WaitSleepers(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		got, busy, ch := len(c.sleepers), c.busy, c.changed
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
