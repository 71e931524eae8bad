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
	const lease = 2 * time.Second
	l := newLockWait(t, "leasestart", lease)

	// A first claim prepares the claim statement on the pool's connection,
	// so that the next one waits for the table lock in its own transaction
	// (a statement prepared anew would wait in its Parse, in another one).
	publishN(t, l.b, l.q, 1)
	ds, err := l.b.Receive(ctx, l.q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("first Receive: %d, %v", len(ds), err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	publishN(t, l.b, l.q, 1)

	// The claim waits for the lock for longer than the lease.
	err = l.behindLock(ctx, t, lease, func() error {
		ds, err = l.b.Receive(ctx, l.q, 1)
		return err
	})
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive behind the lock: %d, %v", len(ds), err)
	}
	l.notClaimedAgain(ctx, t, "right after its claim: its lease was over when it was granted")
}

// lockWait is a broker whose one connection (its statements prepared on
// it) can be made to wait behind a SHARE lock on its jobs table that an
// admin session holds, and a queue.
type lockWait struct {
	app   string
	admin *pgxpool.Pool
	b     *postgres.Broker
	q     string
}

func newLockWait(t *testing.T, name string, lease time.Duration) *lockWait {
	t.Helper()
	l := &lockWait{app: "berth-" + name + "-" + suffix(), q: name + "_" + suffix()}
	pool := newPool(t, l.app, 1)
	l.admin = newPool(t, l.app+"-admin", 2)
	l.b = newBroker(t, pool, postgres.Options{Lease: lease, PollInterval: 50 * time.Millisecond, DisableListen: true})
	return l
}

// behindLock runs op while the admin session holds the lock for one and a
// half leases, op waiting for it, and returns op's error.
func (l *lockWait) behindLock(ctx context.Context, t *testing.T, lease time.Duration, op func() error) error {
	t.Helper()
	tx, err := l.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE `+l.b.Schema()+`.jobs IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- op() }()
	waitForLockWait(ctx, t, l.admin, l.app)
	time.Sleep(lease + lease/2)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	return <-done
}

// notClaimedAgain fails t when another worker, looking at once, claims the
// queue's job: its lease must have just begun.
func (l *lockWait) notClaimedAgain(ctx context.Context, t *testing.T, why string) {
	t.Helper()
	other := newBrokerOn(t, l.admin, l.b.Schema())
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	again, err := other.Receive(rctx, l.q, 1)
	if len(again) != 0 {
		t.Fatal("job claimed again " + why)
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
	const lease = 2 * time.Second
	l := newLockWait(t, "extendstart", lease)
	publishN(t, l.b, l.q, 1)
	ds, err := l.b.Receive(ctx, l.q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	if err := ds[0].ExtendLease(ctx, lease); err != nil { // prepares the statement
		t.Fatalf("ExtendLease: %v", err)
	}
	if err := l.behindLock(ctx, t, lease, func() error { return ds[0].ExtendLease(ctx, lease) }); err != nil {
		t.Fatalf("ExtendLease behind the lock: %v", err)
	}
	l.notClaimedAgain(ctx, t, "right after its lease was extended: the extension was over when it was written")
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatalf("Ack by the holder: %v", err)
	}
}
