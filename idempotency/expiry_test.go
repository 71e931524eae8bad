package idempotency_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
)

// TestNoHeartbeatCancelsAtClaimExpiry: with the heartbeat disabled
// (Heartbeat < 0) nothing extends a lease-mode claim, so once ClaimLease has
// passed another worker may take the key over and run the operation beside
// the handler. The handler's ctx is cancelled then, with ErrClaimLost, as
// when a heartbeat cannot extend the claim in time; nothing cancelled it
// before, and the loss showed only at completion, after the effect had been
// applied twice.
func TestNoHeartbeatCancelsAtClaimExpiry(t *testing.T) {
	const lease = time.Second // long beside the quick handler's lease/10: no flake under load
	g, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{}), Mode: idempotency.Lease,
		Heartbeat: -1, ClaimLease: lease, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "k-expiry", JobType: "t", Fingerprint: "fp"}

	// A handler that outlives the claim is cancelled at its expiry.
	var running atomic.Bool
	start := time.Now()
	var cause error
	var took time.Duration
	_, err = g.Do(context.Background(), op, func(ctx context.Context) error {
		running.Store(true)
		defer running.Store(false)
		select {
		case <-ctx.Done():
			took, cause = time.Since(start), context.Cause(ctx)
			return ctx.Err()
		case <-time.After(10 * lease):
			return errors.New("not cancelled when its claim expired")
		}
	})
	if !errors.Is(cause, idempotency.ErrClaimLost) {
		t.Fatalf("handler's context cause = %v; want ErrClaimLost at the claim's expiry", cause)
	}
	if took < lease {
		t.Errorf("cancelled after %v, before the claim (%v) expired", took, lease)
	}
	if !errors.Is(err, idempotency.ErrClaimLost) {
		t.Errorf("Do = %v; want ErrClaimLost", err)
	}
	// Its claim was released: the redelivery runs at once, alone.
	ran, err := g.Do(context.Background(), op, func(context.Context) error {
		if running.Load() {
			t.Error("the redelivery ran beside the first handler")
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("redelivery: ran=%v err=%v", ran, err)
	}

	// A handler that finishes within the claim is not cancelled, and its
	// result is recorded.
	op.Key = "k-expiry-quick"
	ran, err = g.Do(context.Background(), op, func(ctx context.Context) error {
		time.Sleep(lease / 10)
		return context.Cause(ctx)
	})
	if err != nil || !ran {
		t.Fatalf("quick handler: ran=%v err=%v", ran, err)
	}
	time.Sleep(lease) // past the timer the quick handler's claim had
	if ran, err := g.Do(context.Background(), op, func(context.Context) error { return nil }); err != nil || ran {
		t.Errorf("duplicate of the completed key: ran=%v err=%v; want suppressed", ran, err)
	}

	// A handler whose ctx is already done (shutdown) and that runs on past
	// its claim anyway: Do's error tells that the claim was lost.
	op.Key = "k-expiry-late"
	parent, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = g.Do(parent, op, func(ctx context.Context) error {
		time.Sleep(lease + lease/2)
		return ctx.Err()
	})
	if !errors.Is(err, idempotency.ErrClaimLost) || !errors.Is(err, context.Canceled) {
		t.Errorf("Do of a cancelled handler that outlived its claim = %v; want context.Canceled and ErrClaimLost", err)
	}
}
