package berthtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func handler(err error) sdk.Handler {
	return sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return err })
}

// TestWorkSettlementTable: Work reports what the Worker's own settlement
// rules do with each kind of handler result, and the delivery received
// exactly that one call.
func TestWorkSettlementTable(t *testing.T) {
	flaky := errors.New("connection reset")
	policy := sdk.WorkerOptions{Retry: sdk.RetryPolicy{MaxAttempts: 3, Backoff: sdk.Backoff{Base: time.Second, Jitter: -1}}}
	cases := []struct {
		name      string
		h         sdk.Handler
		opts      []berthtest.Option
		want      sdk.Action
		wantDelay time.Duration
		wantClass sdk.ErrorClass
	}{
		{"nil acks", handler(nil), nil, sdk.ActionAck, 0, sdk.ClassNone},
		{"transient retries with backoff", handler(flaky), []berthtest.Option{berthtest.Attempt(2)}, sdk.ActionRetry, 2 * time.Second, sdk.ClassTransient},
		{"transient at the last attempt dead-letters", handler(flaky), []berthtest.Option{berthtest.Attempt(3)}, sdk.ActionDeadLetter, 0, sdk.ClassTransient},
		{"permanent dead-letters at once", handler(sdk.Permanent(flaky)), nil, sdk.ActionDeadLetter, 0, sdk.ClassPermanent},
		{"retry-after releases", handler(sdk.RetryAfter(flaky, 7*time.Second)), nil, sdk.ActionRelease, 7 * time.Second, sdk.ClassRetryAfter},
		{"retry-after retries without Release", handler(sdk.RetryAfter(flaky, 7*time.Second)), []berthtest.Option{berthtest.WithoutRelease()}, sdk.ActionRetry, 7 * time.Second, sdk.ClassRetryAfter},
		{"panic is transient", sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { panic("boom") }), nil, sdk.ActionRetry, time.Second, sdk.ClassPanic},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]berthtest.Option{berthtest.WorkerOptions(policy)}, tc.opts...)
			res := berthtest.Work(t, tc.h, &sdk.Message{Type: "job"}, opts...)
			if res.Action != tc.want || res.Delay != tc.wantDelay || res.Class != tc.wantClass {
				t.Fatalf("got %s after %s (class %q), want %s after %s (class %q)", res.Action, res.Delay, res.Class, tc.want, tc.wantDelay, tc.wantClass)
			}
			calls := res.Delivery.Calls()
			if len(calls) != 1 || calls[0].Action != tc.want {
				t.Fatalf("delivery calls %+v, want exactly one %s", calls, tc.want)
			}
			if res.DeadLettered() != (tc.want == sdk.ActionDeadLetter) || res.Acked() != (tc.want == sdk.ActionAck) ||
				res.Retried() != (tc.want == sdk.ActionRetry || tc.want == sdk.ActionRelease) {
				t.Errorf("predicates disagree with action %s", res.Action)
			}
			if res.DeadLettered() && res.Reason != sdk.SanitizeReason(res.Cause.Error()) {
				t.Errorf("reason %q, want the cause's text", res.Reason)
			}
		})
	}
}

// TestWorkPreparesTheMessage: the message gets an ID and a correlation ID as
// a publish would give it, and an invalid one fails the test.
func TestWorkPreparesTheMessage(t *testing.T) {
	var corr string
	res := berthtest.Work(t, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		corr = sdk.CorrelationID(ctx)
		return nil
	}), &sdk.Message{Type: "job"})
	m := res.Delivery.Message()
	if m.ID == "" || m.CorrelationID == "" || corr != m.CorrelationID {
		t.Fatalf("ID %q, correlation %q, handler saw %q", m.ID, m.CorrelationID, corr)
	}

	msg := fatalMessage(t, func(tb testing.TB) {
		berthtest.Work(tb, handler(nil), &sdk.Message{Type: "job", Headers: map[string]string{"berth-attempt": "1"}})
	})
	if !strings.Contains(msg, "berthtest: Work") {
		t.Fatalf("a reserved header was not refused: %q", msg)
	}
}

// fatalMessage runs f with a testing.TB whose Fatalf records its message
// and stops f (as Fatalf stops a test) without failing t, and returns the
// message, "" when f did not call Fatalf.
func fatalMessage(t *testing.T, f func(tb testing.TB)) string {
	ft := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = recover() }() // fatalT.Fatalf
		f(ft)
	}()
	<-done
	return ft.msg
}

// fatalT records Fatalf instead of failing the real test.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper() {}
func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(fatalPanic{}) // stop the caller as Fatalf does; the test's goroutine recovers it
}

type fatalPanic struct{}

// TestWorkTimeout: the handler timeout of the WorkerOptions applies; a
// handler past it is settled as a transient failure wrapping ErrJobTimeout.
func TestWorkTimeout(t *testing.T) {
	res := berthtest.Work(t, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		<-ctx.Done()
		return ctx.Err()
	}), &sdk.Message{Type: "slow"}, berthtest.WorkerOptions(sdk.WorkerOptions{Timeout: 20 * time.Millisecond}))
	if res.Action != sdk.ActionRetry || !errors.Is(res.Cause, sdk.ErrJobTimeout) {
		t.Fatalf("got %s (%v), want a retry caused by ErrJobTimeout", res.Action, res.Cause)
	}
}

// TestWorkMiddlewareAndObservers: the WorkerOptions' middleware wraps the
// handler and the observers see the settlement, as under Worker.Run.
func TestWorkMiddlewareAndObservers(t *testing.T) {
	var wrapped atomic.Bool
	mw := func(next sdk.Handler) sdk.Handler {
		return sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
			wrapped.Store(true)
			return next.Handle(ctx, d)
		})
	}
	rec := berthtest.NewRecorder()
	res := berthtest.Work(t, handler(nil), &sdk.Message{Type: "job"},
		berthtest.WorkerOptions(sdk.WorkerOptions{Middleware: []sdk.Middleware{mw}, Observers: []sdk.Observer{rec}}))
	if !res.Acked() || !wrapped.Load() {
		t.Fatalf("acked %v, middleware ran %v", res.Acked(), wrapped.Load())
	}
	if rs := rec.Records(); len(rs) != 1 || rs[0].Action != sdk.ActionAck || rs[0].Message.ID != res.Delivery.Message().ID {
		t.Fatalf("recorder saw %+v", rs)
	}
}

// TestDeliverySettlesOnce: a second settlement is refused with
// ErrAlreadySettled and recorded; lease extensions after it are refused too.
func TestDeliverySettlesOnce(t *testing.T) {
	ctx := context.Background()
	d := berthtest.NewDelivery(&sdk.Message{ID: "m1", Type: "job"}, berthtest.Attempt(3), berthtest.Queue("orders"))
	if d.Attempt() != 3 || d.Queue() != "orders" {
		t.Fatalf("attempt %d queue %q", d.Attempt(), d.Queue())
	}
	if err := d.ExtendLease(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.DeadLetter(ctx, errors.New("late")); !errors.Is(err, sdk.ErrAlreadySettled) {
		t.Fatalf("second settlement: %v, want ErrAlreadySettled", err)
	}
	if err := d.ExtendLease(ctx, time.Second); !errors.Is(err, sdk.ErrAlreadySettled) {
		t.Fatalf("extension after settlement: %v", err)
	}
	if c := d.Wait(t); c.Action != sdk.ActionAck {
		t.Fatalf("first settlement %s", c.Action)
	}
	if n := len(d.Calls()); n != 2 || d.Extensions() != 2 {
		t.Fatalf("%d calls, %d extensions; want 2 and 2", n, d.Extensions())
	}
	if _, ok := d.WithoutRelease().(sdk.Releaser); ok {
		t.Fatal("WithoutRelease still releases")
	}
}

// TestOnExtendRefusalLosesTheLease: a refused extension, forced through
// OnExtend, makes a running Worker give the job up unsettled.
func TestOnExtendRefusalLosesTheLease(t *testing.T) {
	d := berthtest.NewDelivery(&sdk.Message{ID: sdk.NewID(), Type: "job"},
		berthtest.OnExtend(func(context.Context, time.Duration) error { return sdk.ErrLeaseLost }))
	sub := &oneShot{ch: make(chan sdk.Delivery, 1)}
	sub.ch <- d
	rec := berthtest.StartWorker(t, sub, sdk.HandlerFunc(func(ctx context.Context, _ sdk.Delivery) error {
		<-ctx.Done()
		return nil
	}), sdk.WorkerOptions{Queue: "q", Lease: 30 * time.Millisecond, HeartbeatInterval: 10 * time.Millisecond})
	rs := rec.Wait(t, 1)
	if rs[0].Action != sdk.ActionLeaseLost || len(d.Calls()) != 0 {
		t.Fatalf("settlement %s, calls %+v; want lease_lost and no call", rs[0].Action, d.Calls())
	}
}

// oneShot hands out what is sent on ch.
type oneShot struct{ ch chan sdk.Delivery }

func (s *oneShot) Receive(ctx context.Context, _ string, _ int) ([]sdk.Delivery, error) {
	select {
	case d := <-s.ch:
		return []sdk.Delivery{d}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestStartWorkerOnMemory: a Worker on the in-memory broker retries a flaky
// job and the recorder waits for every message to finish.
func TestStartWorkerOnMemory(t *testing.T) {
	b := berthtest.Memory(t)
	var calls atomic.Int32
	rec := berthtest.StartWorker(t, b, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Message().Type == "flaky" && d.Attempt() == 1 {
			calls.Add(1)
			return errors.New("first try fails")
		}
		return nil
	}), sdk.WorkerOptions{Queue: "jobs", Retry: sdk.RetryPolicy{Backoff: sdk.Backoff{Base: time.Millisecond, Jitter: -1}}})
	ctx := context.Background()
	if err := b.Publish(ctx, "jobs", &sdk.Message{Type: "flaky"}, &sdk.Message{Type: "fine"}, &sdk.Message{Type: "fine"}); err != nil {
		t.Fatal(err)
	}
	done := rec.WaitDone(t, 3)
	for _, r := range done {
		if r.Action != sdk.ActionAck {
			t.Errorf("%s finished with %s", r.Message.Type, r.Action)
		}
	}
	// The retry's own settlement may be recorded after the second attempt's
	// ack (see WaitDone), so wait for it rather than read Records at once.
	all := rec.Wait(t, 4)
	var retries int
	for _, r := range all {
		if r.Action == sdk.ActionRetry {
			retries++
			if r.Message.Type != "flaky" || r.Attempt != 1 {
				t.Errorf("retry of %s attempt %d, want flaky attempt 1", r.Message.Type, r.Attempt)
			}
		}
	}
	if all = rec.Records(); len(all) != 4 || retries != 1 || calls.Load() != 1 {
		t.Fatalf("%d settlements, %d retries (%d failures), want 4 (one retry)", len(all), retries, calls.Load())
	}
}

// TestWaitTimesOut: waiting for settlements that never come fails the test
// and names what it waited for (WaitTimeout, the package-wide
// default, still bounds the wait when no SetWaitTimeout was made).
func TestWaitTimesOut(t *testing.T) {
	saved := berthtest.WaitTimeout
	berthtest.WaitTimeout = 20 * time.Millisecond
	t.Cleanup(func() { berthtest.WaitTimeout = saved })
	msg := fatalMessage(t, func(tb testing.TB) { berthtest.NewRecorder().Wait(tb, 2) })
	if !strings.Contains(msg, "2 settlements") {
		t.Fatalf("timeout message %q", msg)
	}
}

// ackRefused is a delivery whose Ack the broker refuses, as a memory or
// PostgreSQL broker refuses the ack of a job whose lease ran out (the job
// is delivered again).
type ackRefused struct{ *berthtest.Delivery }

func (a ackRefused) Ack(ctx context.Context) error {
	_ = a.Delivery.Ack(ctx)
	return fmt.Errorf("ack of %s: %w", a.Message().ID, sdk.ErrLeaseLost)
}

// TestWaitDoneIgnoresRefusedSettlements: an ack (or dead letter) the broker
// refused (Settlement.Err) did not finish the message, which comes back:
// WaitDone must go on waiting for the settlement that does, not return at
// the refused one while the job is still to run again.
func TestWaitDoneIgnoresRefusedSettlements(t *testing.T) {
	m := &sdk.Message{ID: sdk.NewID(), Type: "job"}
	sub := &oneShot{ch: make(chan sdk.Delivery, 2)}
	sub.ch <- ackRefused{berthtest.NewDelivery(m)}
	rec := berthtest.StartWorker(t, sub, handler(nil), sdk.WorkerOptions{Queue: "q"})
	if rs := rec.Wait(t, 1); rs[0].Action != sdk.ActionAck || !errors.Is(rs[0].Err, sdk.ErrLeaseLost) {
		t.Fatalf("first settlement %s (%v), want a refused ack", rs[0].Action, rs[0].Err)
	}

	rec.SetWaitTimeout(50 * time.Millisecond)
	var got []berthtest.Record
	msg := fatalMessage(t, func(tb testing.TB) { got = rec.WaitDone(tb, 1) })
	rec.SetWaitTimeout(0)
	if !strings.Contains(msg, "1 finished messages") {
		t.Fatalf("WaitDone returned %+v after a refused ack, want it to wait (message %q)", got, msg)
	}
	// The timeout must say why the ack seen did not count.
	if !strings.Contains(msg, "refused") || !strings.Contains(msg, "lease lost") {
		t.Errorf("WaitDone's timeout does not say the ack was refused: %q", msg)
	}

	// The redelivery is acked: now the message is finished.
	sub.ch <- berthtest.NewDelivery(m, berthtest.Attempt(2))
	done2 := rec.WaitDone(t, 1)
	if len(done2) != 1 || done2[0].Err != nil || done2[0].Attempt != 2 {
		t.Fatalf("WaitDone = %+v, want the second attempt's ack", done2)
	}
}

// TestWaitTimeoutQuotesMessageText: a message's ID comes from the broker
// (any producer) and is shown in the timeout's summary: quoted, so a control
// sequence in it reaches the terminal escaped, not raw.
func TestWaitTimeoutQuotesMessageText(t *testing.T) {
	m := &sdk.Message{ID: "id\x1b[2J\u202e", Type: "job"}
	sub := &oneShot{ch: make(chan sdk.Delivery, 1)}
	sub.ch <- berthtest.NewDelivery(m)
	rec := berthtest.StartWorker(t, sub, handler(nil), sdk.WorkerOptions{Queue: "q"})
	rec.Wait(t, 1)

	rec.SetWaitTimeout(20 * time.Millisecond)
	msg := fatalMessage(t, func(tb testing.TB) { rec.Wait(tb, 2) })
	if !strings.Contains(msg, `id\x1b[2J`) || strings.ContainsAny(msg, "\x1b\u202e") {
		t.Fatalf("timeout message %q: want the ID quoted, no raw control characters", msg)
	}
}

// TestWorkWithSeveralQueues: Work settles with the WorkerOptions of a
// Worker that consumes several queues (Queues), as the application runs
// it. Before, Work set Queue to the delivery's queue on top of Queues and
// the Worker refused the options ("set Queue or Queues, not both"): the
// test failed before the handler ran.
func TestWorkWithSeveralQueues(t *testing.T) {
	opts := sdk.WorkerOptions{
		Queues: []sdk.WorkerQueue{{Name: "orders", Weight: 3}, {Name: "emails"}},
		Retry:  sdk.RetryPolicy{MaxAttempts: 2, Backoff: sdk.Backoff{Base: time.Second, Jitter: -1}},
	}
	var res berthtest.Result
	msg := fatalMessage(t, func(tb testing.TB) {
		res = berthtest.Work(tb, handler(errors.New("flaky")), &sdk.Message{Type: "job"},
			berthtest.Queue("emails"), berthtest.WorkerOptions(opts))
	})
	if msg != "" {
		t.Fatalf("Work with Queues failed the test: %s", msg)
	}
	if res.Action != sdk.ActionRetry || res.Delay != time.Second || res.Delivery.Queue() != "emails" {
		t.Fatalf("got %s after %s on %q, want a retry after 1s on emails", res.Action, res.Delay, res.Delivery.Queue())
	}
}

// TestSetWaitTimeoutIsPerRecorder: a test under t.Parallel bounds its own
// waits (Recorder.SetWaitTimeout, Delivery.SetWaitTimeout) without writing
// the package-wide WaitTimeout, which parallel tests would race on (the race
// detector fails this test if a wait reads a timeout another test writes).
func TestSetWaitTimeoutIsPerRecorder(t *testing.T) {
	for _, d := range []time.Duration{20 * time.Millisecond, 30 * time.Millisecond} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			rec := berthtest.NewRecorder()
			rec.SetWaitTimeout(d)
			msg := fatalMessage(t, func(tb testing.TB) { rec.Wait(tb, 1) })
			if want := "timed out after " + d.String(); !strings.Contains(msg, want) {
				t.Fatalf("recorder timeout message %q, want %q", msg, want)
			}
			del := berthtest.NewDelivery(&sdk.Message{ID: "m", Type: "job"})
			del.SetWaitTimeout(d)
			msg = fatalMessage(t, func(tb testing.TB) { del.Wait(tb) })
			if want := "not settled within " + d.String(); !strings.Contains(msg, want) {
				t.Fatalf("delivery timeout message %q, want %q", msg, want)
			}
		})
	}
}

// TestSettlementAfterLostLeaseIsRefused: once ExtendLease refused the lease
// (ErrLeaseLost, through OnExtend), a settlement returns an error wrapping
// ErrLeaseLost and settles nothing, as on every broker; the refused call is
// still recorded (with its error) so a test sees that it was made.
func TestSettlementAfterLostLeaseIsRefused(t *testing.T) {
	ctx := context.Background()
	d := berthtest.NewDelivery(&sdk.Message{ID: "m1", Type: "job"},
		berthtest.OnExtend(func(context.Context, time.Duration) error {
			return fmt.Errorf("refused: %w", sdk.ErrLeaseLost)
		}))
	if err := d.ExtendLease(ctx, time.Second); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Fatalf("extension: %v, want ErrLeaseLost", err)
	}
	if err := d.Ack(ctx); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Fatalf("ack after the lease was lost: %v, want ErrLeaseLost", err)
	}
	if err := d.Retry(ctx, time.Second, errors.New("x")); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Fatalf("retry after the lease was lost: %v, want ErrLeaseLost", err)
	}
	if c, ok := d.Settlement(); ok {
		t.Fatalf("settled by %s after the lease was lost", c.Action)
	}
	select {
	case <-d.Done():
		t.Fatal("Done closed by a refused settlement")
	default:
	}
	calls := d.Calls()
	if len(calls) != 2 || calls[0].Action != sdk.ActionAck || !errors.Is(calls[0].Err, sdk.ErrLeaseLost) ||
		calls[1].Action != sdk.ActionRetry || !errors.Is(calls[1].Err, sdk.ErrLeaseLost) {
		t.Fatalf("calls %+v, want the refused ack and retry", calls)
	}
	if err := d.ExtendLease(ctx, time.Second); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Fatalf("extension after the lease was lost: %v, want ErrLeaseLost", err)
	}
}

// TestWaitDoneCountsMessagesNotSettlements: a message delivered twice and
// acked both times (an at-least-once duplicate) is one finished message:
// WaitDone(2) must not return until a second message finishes, and returns
// one record per message.
func TestWaitDoneCountsMessagesNotSettlements(t *testing.T) {
	m1 := &sdk.Message{ID: sdk.NewID(), Type: "job"}
	m2 := &sdk.Message{ID: sdk.NewID(), Type: "job"}
	sub := &oneShot{ch: make(chan sdk.Delivery, 3)}
	sub.ch <- berthtest.NewDelivery(m1)
	sub.ch <- berthtest.NewDelivery(m1, berthtest.Attempt(2))
	rec := berthtest.StartWorker(t, sub, handler(nil), sdk.WorkerOptions{Queue: "q"})
	rec.Wait(t, 2)
	rec.SetWaitTimeout(20 * time.Millisecond)
	var got []berthtest.Record
	msg := fatalMessage(t, func(tb testing.TB) { got = rec.WaitDone(tb, 2) })
	if !strings.Contains(msg, "2 finished messages") {
		t.Fatalf("WaitDone(2) returned %+v after one message acked twice (message %q)", got, msg)
	}
	rec.SetWaitTimeout(0)
	sub.ch <- berthtest.NewDelivery(m2)
	got = rec.WaitDone(t, 2)
	if len(got) != 2 || got[0].Message.ID != m1.ID || got[1].Message.ID != m2.ID {
		t.Fatalf("WaitDone(2) = %+v, want one record of each message", got)
	}
}
