package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
)

// A transactional-mode result is kept for Retention from its completion, as
// in lease mode and in memstore: a redelivery after the commit (the worker
// died before its ack) must find it. The key row used to take its
// expires_at (and completed_at) from the transaction's start, so a handler
// that ran longer than Retention committed a row already expired, which the
// janitor deleted at once, and the redelivery applied the effect again.
func TestTransactionalRetentionCountsFromCommit(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	g, err := idempotency.New(idempotency.Options{Store: e.store, Mode: idempotency.Transactional,
		Retention: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "k-" + randSuffix(), JobType: "t", Fingerprint: "fp"}
	handler := func(ctx context.Context) error {
		tx, _ := pgstore.TxFrom(ctx)
		// The charge's work takes longer than Retention.
		if _, err := tx.Exec(ctx, `SELECT pg_sleep(1.2)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+e.effects()+` (key) VALUES ($1)`, op.Key)
		return err
	}
	if ran, err := g.Do(ctx, op, handler); err != nil || !ran {
		t.Fatalf("first delivery: ran=%v err=%v", ran, err)
	}
	// The janitor runs right after the commit.
	if _, err := idempotency.PurgeExpired(ctx, e.store, 0); err != nil {
		t.Fatal(err)
	}
	// The redelivery of the job whose ack was lost.
	if ran, err := g.Do(ctx, op, handler); err != nil || ran {
		t.Fatalf("redelivery: ran=%v err=%v, want a duplicate", ran, err)
	}
	if n := e.effectCount(t, op.Key); n != 1 {
		t.Fatalf("effect applied %d times, want 1", n)
	}
	rec, err := e.store.Get(ctx, op.Key)
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.ExpiresAt.Sub(rec.CompletedAt); got != time.Second {
		t.Fatalf("expires_at − completed_at = %s, want Retention 1s", got)
	}
}
