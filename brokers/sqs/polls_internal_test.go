package sqs

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPollsHold: hold counts the long polls given up that may still wait on
// the server, from their latest attempt's start to the end of their wait
// plus pollMargin: those under way whose ctx has ended (the SDK has not
// returned yet: a hand-back racing the cancellation must wait too), those
// under way whose earlier attempt's answer was lost, and those that
// returned given up. A poll answered, one still live, or a receive that
// does not long-poll hold nothing.
func TestPollsHold(t *testing.T) {
	base := time.Unix(1_000_000, 0)
	const wait = 2 * time.Second
	start := func(p *polls, ctx context.Context, wait time.Duration) *attempts {
		seen := new(attempts)
		seen.started.Store(base.UnixNano())
		p.begin(ctx, seen, wait)
		return seen
	}
	full := wait + pollMargin

	t.Run("none", func(t *testing.T) {
		var p polls
		if got := p.hold(base); got != 0 {
			t.Fatalf("hold with no poll = %v, want 0", got)
		}
	})
	t.Run("live", func(t *testing.T) {
		var p polls
		seen := start(&p, t.Context(), wait)
		if got := p.hold(base); got != 0 {
			t.Fatalf("hold during a live poll = %v, want 0", got)
		}
		p.end(seen, false)
		if got := p.hold(base); got != 0 {
			t.Fatalf("hold after an answered poll = %v, want 0", got)
		}
	})
	t.Run("cancelled before it returns", func(t *testing.T) {
		var p polls
		ctx, cancel := context.WithCancel(t.Context())
		seen := start(&p, ctx, wait)
		cancel()
		if got := p.hold(base.Add(500 * time.Millisecond)); got != full-500*time.Millisecond {
			t.Fatalf("hold after the cancellation, before the call returned = %v, want %v", got, full-500*time.Millisecond)
		}
		p.end(seen, true)
		if got := p.hold(base.Add(time.Second)); got != full-time.Second {
			t.Fatalf("hold after the call returned given up = %v, want %v", got, full-time.Second)
		}
		if got := p.hold(base.Add(full)); got != 0 {
			t.Fatalf("hold once the poll's wait is over = %v, want 0", got)
		}
	})
	t.Run("earlier attempt lost", func(t *testing.T) {
		var p polls
		seen := start(&p, t.Context(), wait)
		lost := error(errors.New("connection reset"))
		seen.lost.Store(&lost)
		later := base.Add(3 * time.Second) // the retry's start
		seen.started.Store(later.UnixNano())
		if got := p.hold(later); got != full {
			t.Fatalf("hold during a retry after a lost attempt = %v, want %v", got, full)
		}
		p.end(seen, false) // the retry was answered; the lost attempt may still wait
		if got := p.hold(later); got != full {
			t.Fatalf("hold after the retry was answered = %v, want %v", got, full)
		}
	})
	t.Run("no long poll", func(t *testing.T) {
		var p polls
		ctx, cancel := context.WithCancel(t.Context())
		seen := start(&p, ctx, 0)
		cancel()
		p.end(seen, true)
		if got := p.hold(base); got != 0 {
			t.Fatalf("hold after a receive with no wait = %v, want 0", got)
		}
	})
	t.Run("wait in whole seconds", func(t *testing.T) {
		var p polls
		ctx, cancel := context.WithCancel(t.Context())
		seen := start(&p, ctx, 1500*time.Millisecond) // SQS waits 2 s
		cancel()
		p.end(seen, true)
		if got := p.hold(base); got != 2*time.Second+pollMargin {
			t.Fatalf("hold after a poll of 1.5 s = %v, want %v", got, 2*time.Second+pollMargin)
		}
	})
}
