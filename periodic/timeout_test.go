package periodic_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/periodic"
	"github.com/berthq/berth/sdk"
)

// stuckOnce is a Publisher whose first Publish hangs until its ctx ends
// (a broker that never confirms), waiting on the clock when onClock is
// set (for an hour of it: longer than any PublishTimeout here) and else
// on its ctx alone; later publishes go through.
type stuckOnce struct {
	recorder
	clock   *periodic.FakeClock
	onClock bool
	entered chan context.Context // the first publish's ctx, once it hangs
	mu      sync.Mutex
	n       int
	hungErr chan error // what the first publish's ctx ended with
}

func (p *stuckOnce) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	p.mu.Lock()
	p.n++
	first := p.n == 1
	p.mu.Unlock()
	if !first {
		return p.recorder.Publish(ctx, queue, msgs...)
	}
	p.entered <- ctx
	if p.onClock {
		_ = p.clock.Sleep(ctx, time.Hour)
	} else {
		<-ctx.Done()
	}
	p.hungErr <- ctx.Err()
	return ctx.Err()
}

// PublishTimeout is the scheduler's time, as the slots and the retry
// delays are: on a FakeClock, an Advance past it cuts a hung publish short
// (its ctx ends with context.DeadlineExceeded), the slot is retried after
// Options.Retry, and WaitSleepers waits for the scheduler to take that
// failure. An Advance short of it leaves the publish running. It ran on
// real time: the hung publish went on for 30 real seconds whatever the
// test's clock said.
func TestPublishTimeoutFollowsTheClock(t *testing.T) {
	for _, onClock := range []bool{false, true} {
		name := "hung off the clock"
		if onClock {
			name = "hung on the clock"
		}
		t.Run(name, func(t *testing.T) {
			c := periodic.NewFakeClock(t0)
			p := &stuckOnce{clock: c, onClock: onClock, entered: make(chan context.Context, 1), hungErr: make(chan error, 1)}
			s, err := periodic.New(p, periodic.Options{Clock: c, Logger: slog.New(slog.DiscardHandler),
				PublishTimeout: 20 * time.Second,
				Retry:          sdk.Backoff{Base: 5 * time.Second, Max: 5 * time.Second, Jitter: -1}},
				periodic.Job{Name: "j", Schedule: every(t, time.Minute), Queue: "q"})
			if err != nil {
				t.Fatal(err)
			}
			defer runScheduler(t, s)()
			wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer wcancel()
			if err := c.WaitSleepers(wctx, 1); err != nil {
				t.Fatal(err)
			}
			c.Advance(time.Minute) // 00:01:00 due: its publish hangs
			var pctx context.Context
			select {
			case pctx = <-p.entered:
			case <-wctx.Done():
				t.Fatal("the slot's publish did not start")
			}
			c.Advance(19 * time.Second)
			if err := pctx.Err(); err != nil {
				t.Fatalf("publish ctx ended %v after 19 s of a 20 s PublishTimeout", err)
			}
			c.Advance(time.Second)
			select {
			case err := <-p.hungErr:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("hung publish's ctx ended with %v, want context.DeadlineExceeded", err)
				}
			case <-wctx.Done():
				t.Fatal("an Advance past PublishTimeout did not end the hung publish")
			}
			// The failure is taken (retry at 00:01:25) before WaitSleepers
			// returns; the retry publishes the slot.
			if err := c.WaitSleepers(wctx, 1); err != nil {
				t.Fatal(err)
			}
			if got := p.slots(t); len(got) != 0 {
				t.Fatalf("published %v before the retry", got)
			}
			c.Advance(5 * time.Second)
			if err := c.WaitSleepers(wctx, 1); err != nil {
				t.Fatal(err)
			}
			equal(t, "slots", p.slots(t), []string{"00:01:00"})
		})
	}
}

// ownClock is a Clock of the application's that wraps a FakeClock without
// embedding it: the scheduler counts no work on it.
type ownClock struct{ c *periodic.FakeClock }

func (o ownClock) Now() time.Time                                   { return o.c.Now() }
func (o ownClock) Sleep(ctx context.Context, d time.Duration) error { return o.c.Sleep(ctx, d) }

// On any Clock, PublishTimeout is a Sleep on it: moving the clock past it
// ends the hung publish with context.DeadlineExceeded.
func TestPublishTimeoutFollowsAnyClock(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	p := &stuckOnce{clock: c, entered: make(chan context.Context, 1), hungErr: make(chan error, 1)}
	s, err := periodic.New(p, periodic.Options{Clock: ownClock{c}, Logger: slog.New(slog.DiscardHandler), PublishTimeout: 20 * time.Second},
		periodic.Job{Name: "j", Schedule: every(t, time.Minute), Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	defer runScheduler(t, s)()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := c.WaitSleepers(wctx, 1); err != nil { // Run
		t.Fatal(err)
	}
	c.Advance(time.Minute)
	select {
	case <-p.entered:
	case <-wctx.Done():
		t.Fatal("the slot's publish did not start")
	}
	if err := c.WaitSleepers(wctx, 2); err != nil { // Run, and the publish's timeout
		t.Fatal(err)
	}
	c.Advance(20 * time.Second)
	select {
	case err := <-p.hungErr:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("hung publish's ctx ended with %v, want context.DeadlineExceeded", err)
		}
	case <-wctx.Done():
		t.Fatal("moving the clock past PublishTimeout did not end the hung publish")
	}
}

// runScheduler starts s.Run and returns the func that stops it: it cancels
// Run's context and reports an error Run returns.
func runScheduler(t *testing.T, s *periodic.Scheduler) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}
