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

// holdPool acquires every connection of pool until release is called (or
// the test ends): the pool is exhausted, as when every handler holds one.
func holdPool(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n int) (release func()) {
	t.Helper()
	conns := make([]*pgxpool.Conn, 0, n)
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		conns = append(conns, c)
	}
	done := false
	release = func() {
		if done {
			return
		}
		done = true
		for _, c := range conns {
			c.Release()
		}
	}
	t.Cleanup(release)
	return release
}

// TestReceiveCancelledWhilePoolExhausted: a Receive waiting for a pooled
// connection (every one of them in use) returns when its ctx ends. The old
// claim waited for the connection under its own 30s limit, not the
// caller's ctx: a Worker stopping while its handlers held the pool stalled
// in Receive, and the claim then took jobs for a caller that had gone.
func TestReceiveCancelledWhilePoolExhausted(t *testing.T) {
	pool := newPool(t, "hunt-poolfull-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{PollInterval: 100 * time.Millisecond})
	b.SetInternalTimeouts(5*time.Minute, 5*time.Minute) // only the caller's ctx may end the wait
	ctx := testCtx(t)
	if err := b.Publish(ctx, "q", &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	release := holdPool(t, ctx, pool, 2)

	rctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		ds, err := b.Receive(rctx, "q", 1)
		if len(ds) > 0 {
			err = errors.Join(err, errors.New("got deliveries"))
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond) // Receive waits for a connection
	cancel()
	select {
	case err := <-got:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Receive cancelled while the pool was exhausted returned %v; want context.Canceled", err)
		}
	case <-time.After(20 * time.Second):
		release()
		<-got
		t.Fatal("Receive cancelled while the pool was exhausted did not return until a connection was free")
	}
	release()
	// The job was not taken for the caller that left: still queued, no attempt spent.
	var status string
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT status, attempt_count FROM `+b.Schema()+`.jobs`).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "queued" || attempts != 0 {
		t.Fatalf("job is %s with %d attempts; want queued with 0", status, attempts)
	}
}

// TestDeadLetterTimesOnDatabaseClock: the failure times a DeadLetter
// writes into the headers are the database's, as the row's own times (and
// those of a poison job dead-lettered by the claim): the last failure is
// the row's updated_at, the first its first_failure_at. The old DeadLetter
// stamped both with the application host's clock, so with the two hosts'
// clocks apart the headers disagreed with the row, and the last failure
// could precede the first (first_failure_at, from the database, at a
// Retry).
func TestDeadLetterTimesOnDatabaseClock(t *testing.T) {
	pool := newPool(t, "hunt-dlclock-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{})
	ctx := testCtx(t)
	d := leaseOne(t, ctx, b)
	if err := d.DeadLetter(ctx, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	var first, last string
	var firstAt, updatedAt time.Time
	if err := pool.QueryRow(ctx, `SELECT headers->>$1, headers->>$2, first_failure_at, updated_at FROM `+b.Schema()+`.jobs`,
		sdk.HeaderFirstFailure, sdk.HeaderLastFailure).Scan(&first, &last, &firstAt, &updatedAt); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, header string
		want         time.Time
	}{{"first failure", first, firstAt}, {"last failure", last, updatedAt}} {
		got, err := time.Parse(time.RFC3339Nano, c.header)
		if err != nil {
			t.Fatalf("%s header %q: %v", c.name, c.header, err)
		}
		if !got.Equal(c.want) {
			t.Errorf("%s header %s; the row says %s: not the database's clock", c.name, c.header, c.want.UTC().Format(time.RFC3339Nano))
		}
	}
}

// TestCloseDuringClaimHandsBack: a Receive whose claim is running when
// the broker is closed returns sdk.ErrClosed and hands the rows it took
// back, their attempt not counted. The old Receive returned them to a
// caller that could settle none of them (every settlement after Close is
// ErrClosed), so they stayed leased to nobody for the whole lease with an
// attempt spent (a job near its cap was then dead-lettered unrun).
func TestCloseDuringClaimHandsBack(t *testing.T) {
	testCloseDuringClaim(t, false)
}

// TestClosePoolDuringClaimHandsBack: the same, when the application closes
// its pool right after the broker (as the broker's doc asks: Close does
// not close the pool), while the claim still runs. pool.Close waits for
// the claim's connection; the hand-back that took another connection
// after the claim had returned its own found the pool closed, and the
// rows stayed leased to nobody with an attempt spent.
func TestClosePoolDuringClaimHandsBack(t *testing.T) {
	testCloseDuringClaim(t, true)
}

func testCloseDuringClaim(t *testing.T, closePool bool) {
	app := "hunt-closeclaim-" + suffix()
	pool := newPool(t, app, 4)
	admin := newPool(t, "hunt-closeclaim-admin-"+suffix(), 2)
	// The schema is dropped through admin: pool may be closed by then.
	b := newBroker(t, pool, postgres.Options{Schema: freshSchema(t, admin), Lease: 10 * time.Minute, PollInterval: 100 * time.Millisecond})
	ctx := testCtx(t)
	if err := b.Publish(ctx, "q", &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE `+b.Schema()+`.jobs IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ds  []sdk.Delivery
		err error
	}
	got := make(chan result, 1)
	go func() {
		ds, err := b.Receive(ctx, "q", 1)
		got <- result{ds, err}
	}()
	// The claim statement waits for the table lock.
	for {
		var waiting int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the claim never waited for the lock")
		case <-time.After(10 * time.Millisecond):
		}
	}
	_ = b.Close()
	poolClosed := make(chan struct{})
	if closePool {
		// In a goroutine: some pool versions wait for the claim's connection.
		go func() { pool.Close(); close(poolClosed) }()
	} else {
		close(poolClosed)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	<-poolClosed
	if !errors.Is(r.err, sdk.ErrClosed) || len(r.ds) != 0 {
		t.Fatalf("Receive whose claim ran across Close: %d deliveries, %v; want none and ErrClosed", len(r.ds), r.err)
	}
	var status string
	var attempts int
	if err := admin.QueryRow(ctx, `SELECT status, attempt_count FROM `+b.Schema()+`.jobs`).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "queued" || attempts != 0 {
		t.Fatalf("job is %s with %d attempts after Close; want queued with 0 (handed back)", status, attempts)
	}
}

// TestCloseWhilePoolExhausted: a Receive waiting for a pooled connection
// (every one of them in use) returns sdk.ErrClosed at Close, as Close
// says of pending Receive calls. The old one went on waiting under the
// claim limit (30s), then claimed jobs only to hand them back: a Worker
// stopping while its handlers held the pool stalled in Receive.
func TestCloseWhilePoolExhausted(t *testing.T) {
	pool := newPool(t, "hunt-closefull-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{PollInterval: 100 * time.Millisecond})
	b.SetInternalTimeouts(5*time.Minute, 5*time.Minute) // only Close may end the wait
	ctx := testCtx(t)
	if err := b.Publish(ctx, "q", &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	release := holdPool(t, ctx, pool, 2)
	got := make(chan error, 1)
	go func() {
		ds, err := b.Receive(ctx, "q", 1)
		if len(ds) > 0 {
			err = errors.Join(err, errors.New("got deliveries"))
		}
		got <- err
	}()
	// Receive waits for a connection (the pool counts no waiting acquire:
	// were it not waiting yet, it would see the broker closed and pass).
	time.Sleep(300 * time.Millisecond)
	_ = b.Close()
	select {
	case err := <-got:
		if !errors.Is(err, sdk.ErrClosed) {
			t.Fatalf("Receive closed while the pool was exhausted returned %v; want sdk.ErrClosed", err)
		}
	case <-time.After(20 * time.Second):
		release()
		<-got
		t.Fatal("Receive closed while the pool was exhausted did not return until a connection was free")
	}
}
