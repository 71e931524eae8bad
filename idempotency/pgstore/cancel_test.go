package pgstore_test

import (
	"context"
	"testing"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/sdk"
)

// A handler that applied its effect and returned nil while its context was
// cancelled (the Worker shutting down, the delivery's lease lost) must still
// have its result recorded: otherwise, in lease mode, the claim stays
// in_progress, expires, and the redelivery takes it over and applies the
// effect a second time.
func TestSuccessRecordedWhenContextCancelled(t *testing.T) {
	for _, mode := range []idempotency.Mode{idempotency.Transactional, idempotency.Lease} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t)
			g, err := idempotency.New(idempotency.Options{Store: e.store, Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			key := "charge:order_" + randSuffix() + ":v1"
			inner := effectHandler(e, "w", nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			h := g.Middleware()(sdk.HandlerFunc(func(hctx context.Context, d sdk.Delivery) error {
				if err := inner.Handle(hctx, d); err != nil {
					return err
				}
				cancel() // shutdown arrives once the effect is applied
				return nil
			}))
			if err := h.Handle(ctx, newDelivery(chargeMsg(key, `{}`))); err != nil {
				t.Fatalf("Handle = %v, want nil: the handler succeeded", err)
			}
			rec, err := e.store.Get(context.Background(), key)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if rec.Status != idempotency.StatusCompleted {
				t.Fatalf("status = %s, want completed", rec.Status)
			}
			ran := false
			dup := g.Middleware()(sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { ran = true; return nil }))
			if err := dup.Handle(context.Background(), newDelivery(chargeMsg(key, `{}`))); err != nil || ran {
				t.Fatalf("redelivery = %v, ran %v; want nil without running", err, ran)
			}
			if n := e.effectCount(t, key); n != 1 {
				t.Fatalf("effect rows = %d, want 1", n)
			}
		})
	}
}
