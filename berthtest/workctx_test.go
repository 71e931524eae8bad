package berthtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// ctxT is a testing.TB whose Context is ctx (ending as a test's does at its
// cleanup) and whose Errorf is recorded instead of failing the real test.
type ctxT struct {
	testing.TB
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

func (c *ctxT) Helper()                  {}
func (c *ctxT) Context() context.Context { return c.ctx }
func (c *ctxT) Errorf(f string, args ...any) {
	c.mu.Lock()
	c.errs = append(c.errs, fmt.Sprintf(f, args...))
	c.mu.Unlock()
}
func (c *ctxT) errors() string { c.mu.Lock(); defer c.mu.Unlock(); return strings.Join(c.errs, "; ") }

// waiting is a handler that waits on its context (for a reply the test
// never sends) and reports the context's cause once it ends.
func waiting(started chan<- struct{}, cause chan<- error) sdk.Handler {
	return sdk.HandlerFunc(func(ctx context.Context, _ sdk.Delivery) error {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return ctx.Err()
	})
}

// workAsync runs Work on tb in a goroutine and returns its Result, failing
// t if Work did not return within a generous bound (before the fix it
// returned at the job's 30-minute timeout).
func workAsync(t *testing.T, tb testing.TB, h sdk.Handler, afterStart func()) berthtest.Result {
	t.Helper()
	done := make(chan berthtest.Result, 1)
	go func() { done <- berthtest.Work(tb, h, &sdk.Message{Type: "waits"}) }()
	afterStart()
	select {
	case res := <-done:
		return res
	case <-time.After(20 * time.Second):
		t.Fatal("Work still running: its handler's context did not end")
		return berthtest.Result{}
	}
}

// TestWorkEndsWithTheTest: a handler that waits on its context is stopped
// when the test's context ends (its cleanup), as a Worker's shutdown stops
// it: cause ErrShutdown, the delivery released. Before, Work ran it under
// context.Background(): it ran until the job's timeout.
func TestWorkEndsWithTheTest(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tb := &ctxT{TB: t, ctx: ctx}
	started, cause := make(chan struct{}), make(chan error, 1)
	res := workAsync(t, tb, waiting(started, cause), func() { <-started; cancel() })
	if res.Action != sdk.ActionRelease {
		t.Errorf("got %s (%v), want a release", res.Action, res.Cause)
	}
	if err := <-cause; !errors.Is(err, sdk.ErrShutdown) {
		t.Errorf("handler's context ended with %v, want ErrShutdown", err)
	}
	if e := tb.errors(); e != "" {
		t.Errorf("Work failed a test that ended: %s", e)
	}
}

// TestWorkBoundedByWaitTimeout: a handler still running at WaitTimeout is
// stopped, and Work fails the test saying so (a release would otherwise
// pass for Retried).
func TestWorkBoundedByWaitTimeout(t *testing.T) {
	saved := berthtest.WaitTimeout
	berthtest.WaitTimeout = 50 * time.Millisecond
	t.Cleanup(func() { berthtest.WaitTimeout = saved })
	tb := &ctxT{TB: t, ctx: t.Context()}
	started, cause := make(chan struct{}), make(chan error, 1)
	res := workAsync(t, tb, waiting(started, cause), func() {})
	if res.Action != sdk.ActionRelease {
		t.Errorf("got %s (%v), want a release", res.Action, res.Cause)
	}
	if err := <-cause; !errors.Is(err, sdk.ErrShutdown) {
		t.Errorf("handler's context ended with %v, want ErrShutdown", err)
	}
	if e := tb.errors(); !strings.Contains(e, "WaitTimeout") {
		t.Errorf("Work did not fail the test; errors: %q", e)
	}
}

// TestWorkInCleanup: Work called from a Cleanup function, after the test's
// context ended, still runs the handler rather than releasing at once.
func TestWorkInCleanup(t *testing.T) {
	var res berthtest.Result
	t.Run("sub", func(t *testing.T) {
		t.Cleanup(func() { res = berthtest.Work(t, handler(nil), &sdk.Message{Type: "job"}) })
	})
	if !res.Acked() {
		t.Errorf("Work in a Cleanup: %s (%v), want an ack", res.Action, res.Cause)
	}
}

// TestWorkBoundFailsWhateverTheSettlement: a handler stopped at WaitTimeout
// fails the test whatever the Worker then did with it: retried (a delivery
// that cannot be released, WithoutRelease, as on SQS) or acked (a handler
// that returns nil once its context ends). Before, only a release failed
// it: such a hung handler passed a test that checked Retried() or Acked().
func TestWorkBoundFailsWhateverTheSettlement(t *testing.T) {
	saved := berthtest.WaitTimeout
	berthtest.WaitTimeout = 50 * time.Millisecond
	t.Cleanup(func() { berthtest.WaitTimeout = saved })
	hung := func(ret error) sdk.Handler {
		return sdk.HandlerFunc(func(ctx context.Context, _ sdk.Delivery) error {
			<-ctx.Done()
			return ret
		})
	}
	for _, c := range []struct {
		name string
		h    sdk.Handler
		opts []berthtest.Option
		want sdk.Action
	}{
		{"without release", hung(errors.New("stopped")), []berthtest.Option{berthtest.WithoutRelease()}, sdk.ActionRetry},
		{"returns nil", hung(nil), nil, sdk.ActionAck},
	} {
		t.Run(c.name, func(t *testing.T) {
			tb := &ctxT{TB: t, ctx: t.Context()}
			done := make(chan berthtest.Result, 1)
			go func() { done <- berthtest.Work(tb, c.h, &sdk.Message{Type: "waits"}, c.opts...) }()
			var res berthtest.Result
			select {
			case res = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("Work still running")
			}
			if res.Action != c.want {
				t.Errorf("got %s (%v), want %s", res.Action, res.Cause, c.want)
			}
			if e := tb.errors(); !strings.Contains(e, "WaitTimeout") {
				t.Errorf("Work did not fail the test; errors: %q", e)
			}
		})
	}
}

// slowSettled is an Observer whose Settled takes a while (an exporter
// writing synchronously): it runs after the handler has returned.
type slowSettled struct{ d time.Duration }

func (slowSettled) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }
func (s slowSettled) Settled(context.Context, sdk.Delivery, sdk.Settlement) {
	time.Sleep(s.d)
}

// TestWorkBoundAfterHandlerReturned: a handler that returned before
// WaitTimeout does not fail the test when what follows it (an observer's
// Settled, the settlement) runs past the bound: only a handler still
// running at the bound hung. Before, any end of Work's context by the
// bound before Process returned failed the test.
func TestWorkBoundAfterHandlerReturned(t *testing.T) {
	saved := berthtest.WaitTimeout
	berthtest.WaitTimeout = 50 * time.Millisecond
	t.Cleanup(func() { berthtest.WaitTimeout = saved })
	tb := &ctxT{TB: t, ctx: t.Context()}
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	res := berthtest.Work(tb, h, &sdk.Message{Type: "quick"},
		berthtest.WorkerOptions(sdk.WorkerOptions{Observers: []sdk.Observer{slowSettled{200 * time.Millisecond}}}))
	if !res.Acked() {
		t.Errorf("got %s (%v), want an ack", res.Action, res.Cause)
	}
	if e := tb.errors(); e != "" {
		t.Errorf("Work failed the test of a handler that returned at once: %q", e)
	}
}
