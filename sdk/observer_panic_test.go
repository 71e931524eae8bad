package sdk_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// panicky is an observer that panics in the hooks it is told to, with an
// untrusted value (invalid UTF-8, control characters, longer than any
// reason).
type panicky struct {
	start, settled, lease bool
	calls                 atomic.Int32 // hook calls, panicking or not
}

var panicValue = "observer bug\n\x1b[31m\xff" + strings.Repeat("x", 2*sdk.MaxReasonLength)

func (o *panicky) Start(ctx context.Context, _ sdk.Delivery) context.Context {
	o.calls.Add(1)
	if o.start {
		panic(panicValue)
	}
	return ctx
}

func (o *panicky) Settled(context.Context, sdk.Delivery, sdk.Settlement) {
	o.calls.Add(1)
	if o.settled {
		panic(errors.New(panicValue))
	}
}

func (o *panicky) LeaseExtended(context.Context, sdk.Delivery, time.Duration, error) {
	o.calls.Add(1)
	if o.lease {
		panic(panicValue)
	}
}

// logRecords is a slog.Handler keeping the records at ERROR (every record
// with all set), attributes resolved (LogValuers included) and flattened to
// strings.
type logRecords struct {
	all  bool
	mu   sync.Mutex
	recs []map[string]string
}

func (l *logRecords) Enabled(_ context.Context, lv slog.Level) bool {
	return l.all || lv >= slog.LevelError
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.Resolve().String(); return true })
	l.mu.Lock()
	l.recs = append(l.recs, m)
	l.mu.Unlock()
	return nil
}

// observerPanics returns the logged observer panics of method.
func (l *logRecords) observerPanics(method string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, m := range l.recs {
		if strings.Contains(m["msg"], "observer panic") && m["method"] == method {
			out = append(out, m)
		}
	}
	return out
}

// checkPanicLog fails unless a panic of method was logged with the
// observer's type and the panic value as valid UTF-8 of bounded length.
func checkPanicLog(t *testing.T, logs *logRecords, method string) {
	t.Helper()
	recs := logs.observerPanics(method)
	if len(recs) == 0 {
		t.Fatalf("no observer panic logged for %s", method)
	}
	r := recs[0]
	if r["observer"] != "*sdk_test.panicky" {
		t.Errorf("observer = %q, want *sdk_test.panicky", r["observer"])
	}
	if p := r["panic"]; !strings.HasPrefix(p, "observer bug") || !utf8.ValidString(p) || len(p) > sdk.MaxReasonLength {
		t.Errorf("panic value logged as %q (%d bytes): want the value as valid UTF-8 of at most %d bytes", p, len(p), sdk.MaxReasonLength)
	}
}

type ctxKey struct{}

// TestObserverPanicsInStartAndSettled: an observer panicking in Start and in
// Settled does not take the Worker down. Each job is settled once as its
// handler decided, the handler runs in the context the observers before the
// panicking one made, the observers after it are still called, later jobs
// run, and Run returns nil.
func TestObserverPanicsInStartAndSettled(t *testing.T) {
	for _, hook := range []string{"Start", "Settled"} {
		t.Run(hook, func(t *testing.T) {
			sub := newFakeSub()
			logs := &logRecords{}
			bad := &panicky{start: hook == "Start", settled: hook == "Settled"}
			before := observer{start: func(ctx context.Context, _ sdk.Delivery) context.Context {
				return context.WithValue(ctx, ctxKey{}, "before")
			}}
			rec := berthtest.NewRecorder()
			var sawValue atomic.Int32
			h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
				if ctx.Value(ctxKey{}) == "before" {
					sawValue.Add(1)
				}
				if d.Message().Type == "fail" {
					return errors.New("transient")
				}
				return nil
			})
			stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Logger: slog.New(logs),
				Observers: []sdk.Observer{before, bad, rec}})
			jobs := []*berthtest.Delivery{newFake(1, "ok"), newFake(1, "fail"), newFake(1, "ok")}
			for _, f := range jobs {
				sub.ch <- f
				f.Wait(t)
			}
			rec.Wait(t, len(jobs))
			if err := stop(); err != nil {
				t.Fatalf("Run returned %v", err)
			}
			for i, want := range []string{"ack", "retry", "ack"} {
				if a := actions(jobs[i]); len(a) != 1 || a[0] != want {
					t.Errorf("job %d settled %v, want [%s] once", i, a, want)
				}
			}
			if n := sawValue.Load(); n != int32(len(jobs)) {
				t.Errorf("handler saw the earlier observer's context %d times, want %d", n, len(jobs))
			}
			if n := bad.calls.Load(); n != int32(2*len(jobs)) { // Start and Settled of each
				t.Errorf("panicking observer called %d times, want %d", n, 2*len(jobs))
			}
			checkPanicLog(t, logs, hook)
			if n := len(logs.observerPanics(hook)); n != len(jobs) {
				t.Errorf("%d observer panics logged, want %d", n, len(jobs))
			}
		})
	}
}

// TestObserverPanicInAsyncSettled: a panic in Settled for a background ack
// (AsyncAcker), on the goroutine that frees the slots, still frees the slot:
// with a single slot, the next job runs; Run returns nil.
func TestObserverPanicInAsyncSettled(t *testing.T) {
	sub := newFakeSub()
	logs := &logRecords{}
	acks := make(chan func(error), 4)
	bad := &panicky{settled: true}
	stop := runWorker(t, sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Concurrency: 1, Prefetch: 0, Logger: slog.New(logs), Observers: []sdk.Observer{bad}})
	for range 3 {
		sub.ch <- &asyncDelivery{Delivery: newFake(1, "t"), acks: acks}
		select {
		case done := <-acks:
			done(nil) // the slot comes back only once the panicking observer was called
		case <-time.After(berthtest.WaitTimeout):
			t.Fatal("job not run: its slot was never freed")
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if n := bad.calls.Load(); n != 6 { // Start and Settled of each
		t.Errorf("observer called %d times, want 6", n)
	}
	checkPanicLog(t, logs, "Settled")
}

// TestLeaseObserverPanic: a LeaseObserver panicking in LeaseExtended does not
// stop the heartbeat: the lease keeps being extended, the job is acked once
// and later jobs run.
func TestLeaseObserverPanic(t *testing.T) {
	sub := newFakeSub()
	logs := &logRecords{}
	bad := &panicky{lease: true}
	var f *berthtest.Delivery
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Message().Type != "long" {
			return nil
		}
		return runUntilExtended(f, 3).Handle(ctx, d)
	})
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Lease: 30 * time.Millisecond, HeartbeatInterval: 10 * time.Millisecond,
		Logger: slog.New(logs), Observers: []sdk.Observer{bad}})
	f = newFake(1, "long")
	sub.ch <- f.WithoutRelease()
	f.Wait(t)
	later := newFake(1, "short")
	sub.ch <- later
	later.Wait(t)
	if err := stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if a := actions(f); len(a) != 1 || a[0] != "ack" {
		t.Fatalf("long job settled %v, want [ack]", a)
	}
	if a := actions(later); len(a) != 1 || a[0] != "ack" {
		t.Fatalf("later job settled %v, want [ack]", a)
	}
	checkPanicLog(t, logs, "LeaseExtended")
}

// TestObserverStartNilContext: an observer whose Start returns a nil context
// (a bug of its own) does not take the Worker down: the handler runs with
// the context the observer was given, the job is settled as its handler
// decided, later jobs run, and the bug is logged once, not per job.
func TestObserverStartNilContext(t *testing.T) {
	sub := newFakeSub()
	logs := &logRecords{}
	before := observer{start: func(ctx context.Context, _ sdk.Delivery) context.Context {
		return context.WithValue(ctx, ctxKey{}, "before")
	}}
	bad := observer{start: func(context.Context, sdk.Delivery) context.Context { return nil }}
	var sawValue atomic.Int32
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if ctx.Value(ctxKey{}) == "before" && ctx.Err() == nil {
			sawValue.Add(1)
		}
		return nil
	})
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Logger: slog.New(logs), Observers: []sdk.Observer{before, bad}})
	jobs := []*berthtest.Delivery{newFake(1, "a"), newFake(1, "b"), newFake(1, "c")}
	for _, f := range jobs {
		sub.ch <- f
		f.Wait(t)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	for i, f := range jobs {
		if a := actions(f); len(a) != 1 || a[0] != "ack" {
			t.Errorf("job %d settled %v, want [ack] once", i, a)
		}
	}
	if n := sawValue.Load(); n != int32(len(jobs)) {
		t.Errorf("%d of %d handlers ran in the context the observers before the bad one made", n, len(jobs))
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	n := 0
	for _, m := range logs.recs {
		if strings.Contains(m["msg"], "nil context") {
			n++
			if m["observer"] != "sdk_test.observer" {
				t.Errorf("observer = %q, want sdk_test.observer", m["observer"])
			}
		}
	}
	if n != 1 {
		t.Errorf("%d log lines about the nil context, want 1: %v", n, logs.recs)
	}
}

// unprintable is a panic value whose String method panics with another
// unprintable: fmt recovers a String method's panic, but re-panics when
// printing that panic's value panics too.
type unprintable struct{}

func (unprintable) String() string { panic(unprintable{}) }

// TestHandlerPanicValueWhosePrintingPanics: a handler panicking with a value
// that cannot be printed is recovered like any panic (the job retried, later
// jobs run, Run returns nil), its log line and its error naming the value's
// type. Before, logging the value and PanicError.Error re-panicked outside
// any recover and took the process down.
func TestHandlerPanicValueWhosePrintingPanics(t *testing.T) {
	sub := newFakeSub()
	logs := &logRecords{}
	h := sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		if d.Message().Type == "bad" {
			panic(unprintable{})
		}
		return nil
	})
	rec := berthtest.NewRecorder()
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Logger: slog.New(logs), Observers: []sdk.Observer{rec}})
	jobs := []*berthtest.Delivery{newFake(1, "bad"), newFake(1, "ok")}
	for _, f := range jobs {
		sub.ch <- f
		f.Wait(t)
	}
	rec.Wait(t, len(jobs))
	if err := stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	for i, want := range []string{"retry", "ack"} {
		if a := actions(jobs[i]); len(a) != 1 || a[0] != want {
			t.Errorf("job %d settled %v, want [%s] once", i, a, want)
		}
	}
	pe := &sdk.PanicError{Value: unprintable{}}
	if got := pe.Error(); !strings.Contains(got, "sdk_test.unprintable") {
		t.Errorf("PanicError.Error() = %q, want the value's type named", got)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	found := false
	for _, m := range logs.recs {
		if m["msg"] == "berth: handler panic" && strings.Contains(m["panic"], "sdk_test.unprintable") {
			found = true
		}
	}
	if !found {
		t.Errorf("no handler panic logged naming the value's type: %v", logs.recs)
	}
}
