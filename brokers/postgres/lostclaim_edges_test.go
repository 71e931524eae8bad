package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestLostClaimFatalAfterCommit: the claim commits, its rows reach the
// client, and then the session ends with a FATAL error (57P01, as a server
// shut down or a pg_terminate_backend landing between the commit and the
// ReadyForQuery sends; a pooler that lost its server connection sends a
// FATAL too) instead of the ReadyForQuery. A server error is no proof that
// the claim rolled back when it is FATAL: the session, not the statement,
// ended. The claim's rows must be handed back like those of a claim whose
// connection broke. Before the fix recoverClaim took every server error for
// a rollback, and the jobs stayed leased to nobody for the whole lease
// (ten minutes here), an attempt spent.
func TestLostClaimFatalAfterCommit(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := startPGProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), "")
	host, port, _ := net.SplitHostPort(proxy.ln.Addr().String())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.TLSConfig = nil // the proxy reads the protocol in clear
	ctx := testCtx(t)
	proxied, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	admin := newPool(t, "berth-lost-fatal-admin-"+suffix(), 2)
	logs := newLogRecorder()
	b := newBroker(t, proxied, postgres.Options{Lease: 10 * time.Minute, PollInterval: 100 * time.Millisecond,
		DisableListen: true, Logger: slog.New(logs)})
	q := "lostfatal_" + suffix()
	const n = 3
	ids := publishN(t, b, q, n)

	pat := commandComplete("UPDATE " + strconv.Itoa(n)) // the claim's reply, rows taken
	proxy.fatalAfter.Store(&pat)
	ds, err := b.Receive(ctx, q, n)
	if len(ds) > 0 || !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Receive whose session ended after the claim: %d deliveries, %v; want none, ErrUnavailable", len(ds), err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57P01" || proxy.fatals.Load() != 1 {
		t.Fatalf("Receive: %v (%d FATALs sent); want the claim's FATAL 57P01", err, proxy.fatals.Load())
	}
	if rec := waitLog(t, logs, handedBackLog, 20*time.Second); attr(rec, "jobs").Int64() != n {
		t.Errorf("hand-back log: %v, want jobs=%d", rec, n)
	}
	requireAllBack(ctx, t, admin, b.Schema(), q, n, "the hand-back")
	receiveEachOnce(ctx, t, b, q, ids)
}

// TestLostClaimDelayedOnTheWire: the claim's request is held on the way to
// the server (the network delays it) until the broker's claim limit runs
// out and it closes the connection; the server's process for that
// connection is then idle, not yet having read the claim, and its
// connection is still open. The request then arrives: the claim runs and
// commits, unseen by the broker. An idle server process is no proof that
// the claim is over: the hand-back must go on looking until the process is
// gone (or its time runs out), and so find the rows. Before the fix the
// first look, which found the process idle and no row, ended the
// hand-back ("it took no job"), and the jobs stayed leased to nobody for
// the whole lease (ten minutes here), an attempt spent.
func TestLostClaimDelayedOnTheWire(t *testing.T) {
	cfg, proxy := pgProxiedConfig(t)
	cfg.MaxConns = 4
	// No liveness ping on acquire: it would be held too.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	ctx := testCtx(t)
	proxied, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	admin := newPool(t, "berth-lost-delayed-admin-"+suffix(), 2)
	logs := newLogRecorder()
	b := newBroker(t, proxied, postgres.Options{Lease: 10 * time.Minute, PollInterval: 100 * time.Millisecond,
		DisableListen: true, Logger: slog.New(logs)})
	// The claim limit is also the hand-back's: long enough for the
	// request to arrive while the hand-back looks.
	b.SetInternalTimeouts(3*time.Second, 30*time.Second)
	q := "lostdelayed_" + suffix()
	// Prepare the claim statement on the pool's one connection, so the
	// claim is one request.
	wctx, wc := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := b.Receive(wctx, q, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("warm-up Receive on an empty queue: %v", err)
	}
	wc()
	const n = 3
	ids := publishN(t, b, q, n)
	if c := proxied.Stat().TotalConns(); c != 1 {
		t.Fatalf("the pool holds %d connections, want 1: the held one must be the claim's", c)
	}

	proxy.holdRequests()
	ds, err := b.Receive(ctx, q, n)
	if len(ds) > 0 || !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Receive whose claim never arrived in time: %d deliveries, %v; want none, ErrUnavailable", len(ds), err)
	}
	// Let the hand-back look once (the server process is idle, no row is
	// leased), then let the claim arrive.
	const tookNone = "berth/postgres: a claim's reply was lost; it took no job"
	wait := time.NewTimer(time.Second)
	for looked := false; !looked; {
		recs, added := logs.matching(tookNone)
		looked = len(recs) > 0
		if !looked {
			select {
			case <-added:
			case <-wait.C:
				looked = true
			}
		}
	}
	wait.Stop()
	proxy.releaseRequests()

	if rec := waitLog(t, logs, handedBackLog, 15*time.Second); attr(rec, "jobs").Int64() != n {
		t.Errorf("hand-back log: %v, want jobs=%d", rec, n)
	}
	requireAllBack(ctx, t, admin, b.Schema(), q, n, "the hand-back")
	receiveEachOnce(ctx, t, b, q, ids)
}

// TestLostClaimHandBackStopsAtClosedPool: the application closes the pool
// (the broker still open) while the broker waits to hand back a lost
// claim's rows. Nothing will come from that pool again: the hand-back
// gives up at once, logging that the rows come back after their lease,
// instead of trying every 500ms until its bound runs out (a minute here)
// and holding Close, meanwhile, for its whole grace. Before the fix it
// tried until the bound.
func TestLostClaimHandBackStopsAtClosedPool(t *testing.T) {
	cfg, proxy := pgProxiedConfig(t)
	app := "berth-lost-closed-pool-" + suffix()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	ctx := testCtx(t)
	proxied, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	admin := newPool(t, "berth-lost-closed-pool-admin-"+suffix(), 2)
	logs := newLogRecorder()
	b := newBroker(t, proxied, postgres.Options{Schema: freshSchema(t, admin), Lease: 10 * time.Minute,
		PollInterval: 100 * time.Millisecond, DisableListen: true, Logger: slog.New(logs)})
	b.SetInternalTimeouts(time.Minute, 30*time.Second) // the hand-back's bound
	q := "lostclosedpool_" + suffix()
	publishN(t, b, q, 2)
	slowClaims(ctx, t, admin, b.Schema(), 2)
	done := make(chan error, 1)
	go func() {
		ds, err := b.Receive(ctx, q, 2)
		if len(ds) > 0 {
			err = errors.New("got deliveries")
		}
		done <- err
	}()
	for { // the claim sleeps in its trigger, uncommitted
		var sleeping bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event = 'PgSleep')`, app).Scan(&sleeping); err != nil {
			t.Fatal(err)
		}
		if sleeping {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the claim never ran")
		case <-time.After(10 * time.Millisecond):
		}
	}
	proxy.reset(true)
	if err := <-done; !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Receive whose claim's connection was lost: %v, want ErrUnavailable", err)
	}
	proxied.Close() // the hand-back waits for the claim's process meanwhile
	const notBack = "berth/postgres: a claim's reply was lost and the jobs it may have taken could not be handed back; they come back after their lease"
	rec := waitLog(t, logs, notBack, 15*time.Second)
	if err, _ := attr(rec, "hand_back_err").Any().(error); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("hand-back log: %v; want its hand_back_err to wrap sdk.ErrClosed", rec)
	}
}
