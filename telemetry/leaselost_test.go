package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// singleSubscriber is a Subscriber that returns its delivery to the first
// Receive and then waits for its context.
type singleSubscriber struct {
	once sync.Once
	d    sdk.Delivery
}

func (s *singleSubscriber) Receive(ctx context.Context, _ string, _ int) ([]sdk.Delivery, error) {
	var out []sdk.Delivery
	s.once.Do(func() { out = []sdk.Delivery{s.d} })
	if out != nil {
		return out, nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// settlementSink is an Observer that sends each settlement it is told of.
type settlementSink chan sdk.Settlement

func (c settlementSink) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (c settlementSink) Settled(_ context.Context, _ sdk.Delivery, s sdk.Settlement) { c <- s }

// TestLeaseLostIsNoHandlerError: a handler whose context the Worker cancels
// because the delivery's lease was lost (a refused extension) and that
// returns its context's error did not fail: the delivery is reported as a
// lost lease (berth.delivery.settlements and the span's
// berth.settlement.action lease_lost, berth.lease.expirations), not as a
// handler error — no berth.job.errors, no error.type on
// messaging.process.duration or on the span, no exception event. A handler
// that returns an error wrapping context.Canceled while its lease is held
// did fail: that stays a handler error of class canceled.
func TestLeaseLostIsNoHandlerError(t *testing.T) {
	tp, rec := newTracing(t)
	obs, reader := newObserver(t, tp, telemetry.Options{})

	run := func(queue string, extend func(context.Context, time.Duration) error, h sdk.HandlerFunc) sdk.Settlement {
		t.Helper()
		d := berthtest.NewDelivery(&sdk.Message{ID: "m-" + queue, Type: "report.build"}, berthtest.Queue(queue), berthtest.OnExtend(extend))
		settled := make(settlementSink, 1)
		stop := runWorker(t, &singleSubscriber{d: d}, h, sdk.WorkerOptions{Queue: queue, Concurrency: 1,
			Lease: time.Second, HeartbeatInterval: 10 * time.Millisecond, Observers: []sdk.Observer{obs, settled}})
		var s sdk.Settlement
		select {
		case s = <-settled:
		case <-time.After(berthtest.WaitTimeout):
			t.Fatalf("%s: no settlement", queue)
		}
		stop()
		return s
	}

	lost := uniqueQueue(t, "ll")
	var cause error
	s := run(lost, func(context.Context, time.Duration) error { return fmt.Errorf("extend: %w", sdk.ErrLeaseLost) },
		func(ctx context.Context, _ sdk.Delivery) error {
			<-ctx.Done()
			cause = context.Cause(ctx)
			return ctx.Err()
		})
	if !errors.Is(cause, sdk.ErrLeaseLost) || s.Action != sdk.ActionLeaseLost || !errors.Is(s.Cause, context.Canceled) {
		t.Fatalf("lost lease: context cause %v, settlement %s with cause %v; want ErrLeaseLost, lease_lost with context.Canceled", cause, s.Action, s.Cause)
	}

	held := uniqueQueue(t, "lh")
	s = run(held, nil, func(context.Context, sdk.Delivery) error {
		return fmt.Errorf("query: %w", context.Canceled) // the handler's own cancelled call
	})
	if s.Action != sdk.ActionRetry || s.Class != sdk.ClassCanceled {
		t.Fatalf("held lease: settlement %s class %s, want retry canceled", s.Action, s.Class)
	}

	ms := collect(t, reader)
	canceled := telemetryErrorType(string(sdk.ClassCanceled))
	if got := ms.sum("berth.job.errors", semconvDest(lost)); got != 0 {
		t.Errorf("berth.job.errors %v after a lost lease, want 0", got)
	}
	if got := ms.sum("messaging.process.duration", semconvDest(lost), canceled); got != 0 {
		t.Errorf("messaging.process.duration with error.type canceled: %v after a lost lease, want 0", got)
	}
	if got := ms.sum("messaging.process.duration", semconvDest(lost)); got != 1 {
		t.Errorf("messaging.process.duration after a lost lease: %v, want 1", got)
	}
	if got := ms.sum("berth.lease.expirations", semconvDest(lost)); got != 1 {
		t.Errorf("berth.lease.expirations %v, want 1", got)
	}
	sp := points(t, ms, "berth.delivery.settlements", semconvDest(lost))
	if len(sp) != 1 {
		t.Fatalf("settlements after a lost lease: %v, want one point", sp)
	}
	for set, n := range sp {
		a, _ := set.Value(telemetry.AttrAction)
		if _, ok := set.Value("error.type"); ok || n != 1 || a.AsString() != string(sdk.ActionLeaseLost) {
			t.Errorf("settlements after a lost lease: %d of %v, want 1 lease_lost without error.type", n, set.Encoded(nil))
		}
	}
	spans := spansNamed(rec, "process "+lost)
	if len(spans) != 1 {
		t.Fatalf("%d process spans, want 1", len(spans))
	}
	a := attrsOf(spans[0])
	if a[telemetry.AttrAction].AsString() != string(sdk.ActionLeaseLost) || a["error.type"].AsString() != "" {
		t.Errorf("lost lease span: action %q, error.type %q; want lease_lost without error.type", a[telemetry.AttrAction].AsString(), a["error.type"].AsString())
	}
	if st := spans[0].Status(); st.Code != codes.Error || st.Description != "lease lost" {
		t.Errorf("lost lease span status %v, want error \"lease lost\"", st)
	}
	if ev := spans[0].Events(); len(ev) != 0 {
		t.Errorf("lost lease span events %v, want none (no handler error)", ev)
	}

	if got := ms.sum("berth.job.errors", semconvDest(held), canceled); got != 1 {
		t.Errorf("berth.job.errors canceled with the lease held: %v, want 1", got)
	}
	if got := ms.sum("messaging.process.duration", semconvDest(held), canceled); got != 1 {
		t.Errorf("messaging.process.duration canceled with the lease held: %v, want 1", got)
	}
	hs := spansNamed(rec, "process "+held)
	if len(hs) != 1 || attrsOf(hs[0])["error.type"].AsString() != string(sdk.ClassCanceled) || hs[0].Status().Code != codes.Error {
		t.Errorf("held lease spans %d; want 1 with error.type canceled and error status", len(hs))
	}
}
