package berthtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// TestResultRefusedSettlementIsNoOutcome: a settlement the delivery
// refused (Settlement.Err) did nothing, as on every broker, so Acked,
// DeadLettered and Retried must not report it as the job's outcome (as
// Recorder.WaitDone does not count it). Before, they read the Action
// alone: a handler that settled the delivery itself (acked it, then
// failed) passed a test of Retried while its job was acked, never run
// again; one that lost its lease and returned nil passed Acked while its
// ack was refused and the job would run again.
func TestResultRefusedSettlementIsNoOutcome(t *testing.T) {
	selfAck := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		_ = d.Ack(ctx) // a contract violation: handlers never settle
		return errors.New("downstream failed")
	})
	res := berthtest.Work(t, selfAck, &sdk.Message{Type: "job"})
	if res.Action != sdk.ActionRetry || !errors.Is(res.Err, sdk.ErrAlreadySettled) {
		t.Fatalf("got %s (err %v), want a retry refused with ErrAlreadySettled", res.Action, res.Err)
	}
	if c, _ := res.Delivery.Settlement(); c.Action != sdk.ActionAck {
		t.Fatalf("the delivery was settled by %s, want the handler's ack", c.Action)
	}
	if res.Retried() || res.Acked() || res.DeadLettered() {
		t.Errorf("Retried %v Acked %v DeadLettered %v for a refused retry, want all false",
			res.Retried(), res.Acked(), res.DeadLettered())
	}

	lost := berthtest.OnExtend(func(context.Context, time.Duration) error { return sdk.ErrLeaseLost })
	ignoresLoss := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		_ = d.ExtendLease(ctx, time.Minute) // refused: another consumer may run the job
		return nil
	})
	res = berthtest.Work(t, ignoresLoss, &sdk.Message{Type: "job"}, lost)
	if res.Action != sdk.ActionAck || !errors.Is(res.Err, sdk.ErrLeaseLost) {
		t.Fatalf("got %s (err %v), want an ack refused with ErrLeaseLost", res.Action, res.Err)
	}
	if res.Acked() {
		t.Error("Acked for an ack the delivery refused after the lease was lost")
	}
	failsAfterLoss := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		_ = d.ExtendLease(ctx, time.Minute)
		return sdk.Permanent(errors.New("bad order"))
	})
	if res = berthtest.Work(t, failsAfterLoss, &sdk.Message{Type: "job"}, lost); res.DeadLettered() || res.Reason != "" {
		t.Errorf("DeadLettered %v (reason %q) for a dead letter refused with %v", res.DeadLettered(), res.Reason, res.Err)
	}
}
