package sdk_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

func newMemory(t *testing.T, opts memory.Options) *memory.Broker {
	t.Helper()
	b, err := memory.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func publish(t *testing.T, b sdk.Publisher, queue string, msgs ...*sdk.Message) {
	t.Helper()
	if err := b.Publish(context.Background(), queue, msgs...); err != nil {
		t.Fatal(err)
	}
}

func fastRetry() sdk.RetryPolicy {
	return sdk.RetryPolicy{MaxAttempts: 5, Backoff: sdk.Backoff{Base: time.Millisecond, Max: time.Millisecond, Jitter: -1}}
}

// TestHardening12_JobTimeout: a handler that blocks on its context is
// cancelled at the timeout with cause ErrJobTimeout (matching
// context.DeadlineExceeded), and the job is retried as a transient failure
// whose cause wraps ErrJobTimeout; the retry succeeds. Before, no timeout
// existed: the handler blocked for ever while the heartbeat kept its lease.
func TestHardening12_JobTimeout(t *testing.T) {
	b := newMemory(t, memory.Options{})
	rec := berthtest.NewRecorder()
	causes := make(chan error, 1)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Attempt() > 1 {
			return nil
		}
		<-ctx.Done() // hung, but honours its context
		causes <- context.Cause(ctx)
		return ctx.Err()
	})
	runWorker(t, b, h, sdk.WorkerOptions{Queue: "jobs", Timeout: 100 * time.Millisecond,
		Retry: fastRetry(), Observers: []sdk.Observer{rec}})
	publish(t, b, "jobs", &sdk.Message{Type: "slow"})

	// Both settlements, in either order: the first attempt's observers are
	// told after its Retry, and its redelivery (1 ms later) may be acked and
	// told first when that goroutine is descheduled meanwhile.
	all := rec.WaitFor(t, "the retry and its ack", func(all []berthtest.Record) bool {
		return len(all) >= 2
	})
	cause := <-causes
	if !errors.Is(cause, sdk.ErrJobTimeout) || !errors.Is(cause, context.DeadlineExceeded) {
		t.Errorf("handler ctx cause = %v, want ErrJobTimeout matching context.DeadlineExceeded", cause)
	}
	if len(all) != 2 {
		t.Fatalf("settlements %+v, want a retry then an ack", all)
	}
	if all[0].Attempt > all[1].Attempt {
		all[0], all[1] = all[1], all[0]
	}
	first := all[0].Settlement
	if first.Action != sdk.ActionRetry || first.Class != sdk.ClassTransient || !errors.Is(first.Cause, sdk.ErrJobTimeout) {
		t.Errorf("timed-out attempt settled %s class %q cause %v; want a transient retry caused by ErrJobTimeout", first.Action, first.Class, first.Cause)
	}
	if all[1].Attempt != 2 || all[1].Action != sdk.ActionAck {
		t.Errorf("second attempt settled %s at attempt %d, want an ack at 2", all[1].Action, all[1].Attempt)
	}
}

// TestHardening12_TimeoutByType: the per-type timeout overrides the default
// one, both ways: a type with a short timeout is cut off while another type,
// under the long default, runs to completion.
func TestHardening12_TimeoutByType(t *testing.T) {
	b := newMemory(t, memory.Options{})
	rec := berthtest.NewRecorder()
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if typ := d.Message().Type; typ == "short" || typ == "default" {
			// Meant to be cut off: it ends only with its context, so a
			// starved watchdog cannot turn it into an ack, and a timeout
			// never applied fails the test by its wait.
			<-ctx.Done()
			return ctx.Err()
		}
		select {
		case <-time.After(300 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	runWorker(t, b, h, sdk.WorkerOptions{Queue: "jobs", Timeout: time.Minute,
		TimeoutByType: map[string]time.Duration{"short": 50 * time.Millisecond},
		Retry:         sdk.RetryPolicy{MaxAttempts: 1}, Observers: []sdk.Observer{rec}})
	publish(t, b, "jobs", &sdk.Message{Type: "short"}, &sdk.Message{Type: "long"})
	checkTimeouts(t, rec, 2, map[string]sdk.Action{"short": sdk.ActionDeadLetter, "long": sdk.ActionAck})

	// A short default, lifted for one type (longer) and another (none).
	b2 := newMemory(t, memory.Options{})
	rec2 := berthtest.NewRecorder()
	runWorker(t, b2, h, sdk.WorkerOptions{Queue: "jobs", Timeout: 50 * time.Millisecond,
		TimeoutByType: map[string]time.Duration{"medium": time.Minute, "unbounded": -1},
		Retry:         sdk.RetryPolicy{MaxAttempts: 1}, Observers: []sdk.Observer{rec2}})
	publish(t, b2, "jobs", &sdk.Message{Type: "default"}, &sdk.Message{Type: "medium"}, &sdk.Message{Type: "unbounded"})
	checkTimeouts(t, rec2, 3, map[string]sdk.Action{"default": sdk.ActionDeadLetter, "medium": sdk.ActionAck, "unbounded": sdk.ActionAck})
}

func checkTimeouts(t *testing.T, rec *berthtest.Recorder, n int, want map[string]sdk.Action) {
	t.Helper()
	all := rec.WaitFor(t, "all settled", func(all []berthtest.Record) bool { return len(all) == n })
	for _, r := range all {
		switch w := want[r.Message.Type]; {
		case r.Action != w:
			t.Errorf("%s: %s cause %v; want %s", r.Message.Type, r.Action, r.Cause, w)
		case w == sdk.ActionDeadLetter && !errors.Is(r.Cause, sdk.ErrJobTimeout):
			t.Errorf("%s: dead-lettered by %v; want ErrJobTimeout", r.Message.Type, r.Cause)
		}
	}
}

// TestHardening12_TimeoutAbandonsHandlerIgnoringContext: a handler that
// ignores its context cannot be stopped, but it no longer holds its job:
// after the timeout the heartbeat stops extending the lease, the broker
// delivers the job again, and another run completes it while the first is
// still stuck. Its late settlement is refused as lease lost. Before, the
// heartbeat extended the lease for as long as the handler hung.
func TestHardening12_TimeoutAbandonsHandlerIgnoringContext(t *testing.T) {
	b := newMemory(t, memory.Options{Lease: 300 * time.Millisecond})
	rec := berthtest.NewRecorder()
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Attempt() == 1 {
			<-release // ignores ctx entirely
			return nil
		}
		return nil
	})
	stop := runWorker(t, b, h, sdk.WorkerOptions{Queue: "jobs", Timeout: 100 * time.Millisecond,
		Concurrency: 2, Observers: []sdk.Observer{rec}})
	publish(t, b, "jobs", &sdk.Message{Type: "hung"})

	rec.WaitFor(t, "the redelivery to be acked while the first run hangs", func(all []berthtest.Record) bool {
		return len(all) == 1 && all[0].Attempt == 2 && all[0].Action == sdk.ActionAck
	})
	unblock()
	all := rec.WaitFor(t, "the hung run's late settlement", func(all []berthtest.Record) bool { return len(all) == 2 })
	late := all[1]
	if late.Attempt != 1 || !errors.Is(late.Err, sdk.ErrLeaseLost) {
		t.Errorf("late settlement of attempt %d: %s err %v; want refused with ErrLeaseLost", late.Attempt, late.Action, late.Err)
	}
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestHardening13_UnknownTypeDeadLetterByDefault: by default a job of an
// unregistered type is dead-lettered at its first delivery with a reason
// naming the type, quoted and bounded (the type is untrusted: before, a huge
// type was copied whole into the error, hence into logs and spans).
func TestHardening13_UnknownTypeDeadLetterByDefault(t *testing.T) {
	b := newMemory(t, memory.Options{})
	r := sdk.NewRouter()
	r.RegisterFunc("known", func(context.Context, sdk.Delivery) error { return nil })
	rec := berthtest.NewRecorder()
	runWorker(t, b, r, sdk.WorkerOptions{Queue: "jobs", Observers: []sdk.Observer{rec}})
	evil := "ghost\u202e" + strings.Repeat("x", 10000)
	publish(t, b, "jobs", &sdk.Message{Type: evil})

	all := rec.WaitFor(t, "the dead letter", func(all []berthtest.Record) bool { return len(all) == 1 })
	s := all[0].Settlement
	if s.Action != sdk.ActionDeadLetter || all[0].Attempt != 1 || !errors.Is(s.Cause, sdk.ErrUnknownJobType) || s.Class != sdk.ClassPermanent {
		t.Fatalf("unknown type settled %s at attempt %d, cause %v; want a permanent dead letter at attempt 1", s.Action, all[0].Attempt, s.Cause)
	}
	msg := s.Cause.Error()
	if !strings.Contains(msg, `"ghost\u202exxx`) {
		t.Errorf("cause %.80q does not name the type quoted", msg)
	}
	if len(msg) > sdk.MaxTypeInReason+100 {
		t.Errorf("cause is %d bytes: the untrusted type is not bounded", len(msg))
	}
	dls, err := b.ListDeadLetters(context.Background(), "jobs", 0)
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters: %d, %v", len(dls), err)
	}
	if reason := dls[0].Header(sdk.HeaderDeadLetterReason); !strings.Contains(reason, "unknown job type") || strings.ContainsRune(reason, '\u202e') {
		t.Errorf("dead-letter reason %.80q: want the type named, control characters escaped", reason)
	}
}

// TestHardening13_UnknownTypeRetryPolicy: with RetryUnknown, a job whose type
// this consumer does not know yet (producers shipped first) is handed back
// without consuming an attempt, and is handled once the type is registered,
// as a newer consumer would. Before, it was dead-lettered at once.
func TestHardening13_UnknownTypeRetryPolicy(t *testing.T) {
	b := newMemory(t, memory.Options{})
	r := sdk.NewRouter()
	r.HandleUnknown(sdk.RetryUnknown(20 * time.Millisecond))
	rec := berthtest.NewRecorder()
	runWorker(t, b, r, sdk.WorkerOptions{Queue: "jobs", Observers: []sdk.Observer{rec}})
	publish(t, b, "jobs", &sdk.Message{Type: "v2.job"})

	rec.WaitFor(t, "two releases", func(all []berthtest.Record) bool { return len(all) >= 2 })
	handled := make(chan int, 1)
	r.RegisterFunc("v2.job", func(_ context.Context, d sdk.Delivery) error {
		handled <- d.Attempt()
		return nil
	})
	all := rec.WaitFor(t, "the ack", func(all []berthtest.Record) bool {
		return len(all) > 0 && all[len(all)-1].Action == sdk.ActionAck
	})
	for _, x := range all[:len(all)-1] {
		if x.Action != sdk.ActionRelease || x.Class != sdk.ClassRetryAfter || !errors.Is(x.Cause, sdk.ErrUnknownJobType) || x.Delay != 20*time.Millisecond {
			t.Errorf("while unknown: %s class %q delay %s cause %v; want a release after 20ms caused by ErrUnknownJobType", x.Action, x.Class, x.Delay, x.Cause)
		}
	}
	if got := <-handled; got != 1 {
		t.Errorf("handled at attempt %d, want 1: waiting for a handler must not consume attempts", got)
	}
}

// TestHardening15_RouterDoubleRegisterPanics: registering a type twice is a
// wiring bug; like http.ServeMux, Register panics instead of silently
// replacing the first handler (as it did before).
func TestHardening15_RouterDoubleRegisterPanics(t *testing.T) {
	r := sdk.NewRouter()
	r.RegisterFunc("billing.charge", func(context.Context, sdk.Delivery) error { return nil })
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			if v := recover(); v == nil {
				t.Errorf("%s did not panic", what)
			} else if s, _ := v.(string); !strings.Contains(s, "billing.charge") {
				t.Errorf("%s panicked with %v; want the type named", what, v)
			}
		}()
		f()
	}
	mustPanic("Register of a registered type", func() {
		r.Register("billing.charge", sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }))
	})
	mustPanic("RegisterFunc of a registered type", func() {
		r.RegisterFunc("billing.charge", func(context.Context, sdk.Delivery) error { return errors.New("second") })
	})
	mustPanic("Register of a nil handler", func() { r.Register("billing.charge", nil) })
	if err := r.Handle(context.Background(), newFake(1, "billing.charge")); err != nil {
		t.Errorf("the first handler was replaced: %v", err)
	}
}
