package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
)

// TestClaimLeaseCountsFromTheClaim: a claim that waits for the jobs table
// (behind a lock a migration's CREATE INDEX or an operator's LOCK TABLE
// holds) longer than the lease must still give its jobs a whole lease from
// when it took them. Before the fix the lease was now() + Lease, now()
// being the start of the claim's transaction, before the wait: the job was
// returned with its lease already run out, and the next Receive of any
// worker took it again at once, while the first ran it.
func TestClaimLeaseCountsFromTheClaim(t *testing.T) {
	ctx := testCtx(t)
	app := "berth-leasestart-" + suffix()
	pool := newPool(t, app, 1) // one connection: the claim statement is prepared on it
	admin := newPool(t, app+"-admin", 2)
	const lease = 2 * time.Second
	b := newBroker(t, pool, postgres.Options{Lease: lease, PollInterval: 50 * time.Millisecond, DisableListen: true})
	q := "leasestart_" + suffix()

	// A first claim prepares the claim statement on the pool's connection,
	// so that the next one waits for the table lock in its own transaction
	// (a statement prepared anew would wait in its Parse, in another one).
	publishN(t, b, q, 1)
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("first Receive: %d, %v", len(ds), err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	publishN(t, b, q, 1)

	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE `+b.Schema()+`.jobs IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int
		err error
	}
	got := make(chan result, 1)
	go func() {
		ds, err := b.Receive(ctx, q, 1)
		got <- result{len(ds), err}
	}()
	// The claim waits for the lock for longer than the lease.
	waitForLockWait(ctx, t, admin, app)
	time.Sleep(lease + lease/2)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.n != 1 {
		t.Fatalf("Receive behind the lock: %d, %v", r.n, r.err)
	}

	// Another worker looks at once: the job's lease has just begun.
	other := newBrokerOn(t, admin, b.Schema())
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	again, err := other.Receive(rctx, q, 1)
	if len(again) != 0 {
		t.Fatalf("job claimed again right after its claim: its lease was over when it was granted")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Receive: %v, want its deadline", err)
	}
}

// waitForLockWait waits until a session whose application_name is app
// waits for a lock.
func waitForLockWait(ctx context.Context, t *testing.T, admin *pgxpool.Pool, app string) {
	t.Helper()
	for {
		var waiting bool
		err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock')`, app).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the claim never waited for the lock")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// newBrokerOn returns a broker on pool and the existing schema, closed at
// cleanup.
func newBrokerOn(t *testing.T, pool *pgxpool.Pool, schema string) *postgres.Broker {
	t.Helper()
	b, err := postgres.New(pool, postgres.Options{Schema: schema, DisableListen: true, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestExtendLeaseCountsFromTheExtension: an ExtendLease that waits for the
// jobs table longer than its extension must still extend the lease to a
// whole extension from when it writes it. Before the fix it extended to
// now() + by, now() being the start of its transaction, before the wait:
// a time already past, so the job was claimed again at once by another
// worker while its holder, told its lease was extended, still ran it.
func TestExtendLeaseCountsFromTheExtension(t *testing.T) {
	ctx := testCtx(t)
	app := "berth-extendstart-" + suffix()
	pool := newPool(t, app, 1) // one connection: the extension statement is prepared on it
	admin := newPool(t, app+"-admin", 2)
	const lease = 2 * time.Second
	b := newBroker(t, pool, postgres.Options{Lease: lease, PollInterval: 50 * time.Millisecond, DisableListen: true})
	q := "extendstart_" + suffix()
	publishN(t, b, q, 1)
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	if err := ds[0].ExtendLease(ctx, lease); err != nil { // prepares the statement
		t.Fatalf("ExtendLease: %v", err)
	}

	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE `+b.Schema()+`.jobs IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	extended := make(chan error, 1)
	go func() { extended <- ds[0].ExtendLease(ctx, lease) }()
	waitForLockWait(ctx, t, admin, app)
	time.Sleep(lease + lease/2)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-extended; err != nil {
		t.Fatalf("ExtendLease behind the lock: %v", err)
	}

	other := newBrokerOn(t, admin, b.Schema())
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	again, err := other.Receive(rctx, q, 1)
	if len(again) != 0 {
		t.Fatalf("job claimed again right after its lease was extended: the extension was over when it was written")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Receive: %v, want its deadline", err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatalf("Ack by the holder: %v", err)
	}
}
