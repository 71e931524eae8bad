package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// When the broker's own time limit ran out (a
// claim's, an ack flush's) while the caller's ctx was live, the caller got a
// bare context.DeadlineExceeded instead of an error wrapping
// sdk.ErrUnavailable. The limits (30s) are shortened here; the rule itself
// is tested in wrap_internal_test.go.

// TestHungClaimIsUnavailable: a claim that hangs ends at the broker's claim
// limit; Receive, whose ctx is live, reports ErrUnavailable with the
// deadline in the chain.
func TestHungClaimIsUnavailable(t *testing.T) {
	pool := newPool(t, "fix-hungclaim-"+suffix(), 8)
	b := newBroker(t, pool, postgres.Options{})
	b.SetInternalTimeouts(500*time.Millisecond, 500*time.Millisecond)
	ctx := testCtx(t)
	if err := b.Publish(ctx, "q", &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	lockJobs(t, ctx, pool, b)
	_, err := b.Receive(ctx, "q", 1)
	if ctx.Err() != nil {
		t.Fatalf("test ctx ended: %v", ctx.Err())
	}
	if !errors.Is(err, sdk.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive with a live ctx whose claim hung returned %v; want an error wrapping ErrUnavailable and the deadline", err)
	}
	// The caller's own deadline is still reported as such.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	b.SetInternalTimeouts(time.Second, time.Second) // the claim outlives the caller's ctx (not cut by it)
	_, err = b.Receive(cctx, "q", 1)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Receive whose own ctx ran out returned %v; want its context.DeadlineExceeded", err)
	}
}

// TestHungAckIsUnavailable: an ack whose flush hangs ends at the acker's
// limit; Ack, whose ctx is live, reports ErrUnavailable.
func TestHungAckIsUnavailable(t *testing.T) {
	pool := newPool(t, "fix-hungack-"+suffix(), 8)
	b := newBroker(t, pool, postgres.Options{})
	b.SetInternalTimeouts(500*time.Millisecond, 500*time.Millisecond)
	ctx := testCtx(t)
	d := leaseOne(t, ctx, b)
	lockJobs(t, ctx, pool, b)
	err := d.Ack(ctx)
	if ctx.Err() != nil {
		t.Fatalf("test ctx ended: %v", ctx.Err())
	}
	if !errors.Is(err, sdk.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ack with a live ctx whose flush hung returned %v; want an error wrapping ErrUnavailable and the deadline", err)
	}
}

// leaseOne publishes one job on queue "q" and receives it.
func leaseOne(t *testing.T, ctx context.Context, b *postgres.Broker) sdk.Delivery {
	t.Helper()
	if err := b.Publish(ctx, "q", &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "q", 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %v, %d deliveries", err, len(ds))
	}
	return ds[0]
}

// lockJobs holds an exclusive lock on b's jobs table until the test ends:
// every statement on it hangs, as on a server that stopped answering.
func lockJobs(t *testing.T, ctx context.Context, pool *pgxpool.Pool, b *postgres.Broker) {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `LOCK TABLE `+b.Schema()+`.jobs IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
}
