package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestInProgressDelayByDatabaseClock: on a broker where every retry counts
// an attempt (SQS), a duplicate that finds a live lease-mode claim is retried
// when the claim expires by the database's clock, the one that decides the
// takeover, not by the worker's. Here the worker's clock is a minute ahead
// of the database's: the store's queries see a now() one minute behind
// (a now() of the test's schema, first on the search_path). Before,
// the guard waited time.Until(LockedUntil) — a minute short — and the retry
// found the claim still in progress and cost another attempt, until the
// message was dead-lettered while the claim's owner still ran it.
func TestInProgressDelayByDatabaseClock(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const skew = time.Minute
	schema := pgx.Identifier{e.schema}.Sanitize()
	if _, err := e.pool.Exec(ctx, `CREATE FUNCTION `+schema+`.now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$ SELECT pg_catalog.now() - interval '1 minute' $$`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema + ", pg_catalog"
	behind, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(behind.Close) // before newEnv's cleanup drops the schema
	var lag float64
	if err := behind.QueryRow(ctx, `SELECT extract(epoch FROM pg_catalog.now() - now())`).Scan(&lag); err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(lag * float64(time.Second)); got != skew {
		t.Fatalf("the store's now() is %s behind, want %s", got, skew)
	}
	store, err := pgstore.New(behind, pgstore.Options{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}

	const lease = 2 * time.Minute
	g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease, ClaimLease: lease,
		InProgressDelay: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	key := "charge:order_" + randSuffix() + ":v1"
	m := chargeMsg(key, `{"order":"o1"}`)
	// Another worker's live claim.
	c := idempotency.Claim{Key: key, JobType: m.Type, Fingerprint: idempotency.Fingerprint(m), Owner: "other", Lease: lease, Retention: time.Hour}
	if out, _, err := store.Claim(ctx, c); out != idempotency.Acquired || err != nil {
		t.Fatalf("Claim = %v, %v", out, err)
	}
	h := g.Middleware()(sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
		t.Error("handler ran while the key is claimed")
		return nil
	}))
	err = h.Handle(ctx, newDelivery(m).WithoutRelease())
	var ra *sdk.RetryAfterError
	if !errors.As(err, &ra) || !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("Handle = %v, want RetryAfter wrapping ErrInProgress", err)
	}

	// What the database says is left of the claim now, after the delay
	// was chosen: the retry must not come before it.
	var leftUS int64
	var lockedUntil time.Time
	if err := behind.QueryRow(ctx, `SELECT (extract(epoch FROM locked_until - now()) * 1000000)::bigint, locked_until FROM `+store.Table()+` WHERE idempotency_key = $1`, key).Scan(&leftUS, &lockedUntil); err != nil {
		t.Fatal(err)
	}
	left := time.Duration(leftUS) * time.Microsecond
	if ra.Delay < left || ra.Delay > lease {
		t.Errorf("retry after %s; the claim has %s left by the database's clock (lease %s): want within [%s, %s]",
			ra.Delay, left, lease, left, lease)
	}
	// The worker's clock would have said a minute less (generous bound:
	// half of it).
	if byWorker := time.Until(lockedUntil); byWorker > left-skew/2 {
		t.Fatalf("skew not visible: by the worker's clock the claim has %s left, by the database's %s", byWorker, left)
	}
}
