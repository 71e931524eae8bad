package pgretry_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/internal/pgretry"
)

// TestPoolProbeKeepsSlowConnections: for a cancelled connect, ClosedBy
// probes the pool (PoolClosed, which the postgres broker's LISTEN watcher
// also runs every 5 s and the outbox relay after a cut connect); an open
// one it takes for open without destroying its connection when a round
// trip takes longer than the probe's 100 ms (2 x 300 ms through a proxy),
// and also when the pool's one connection is in use; a closed one it
// reports closed. Before, the probe's 100 ms deadline was the ping's
// (pgxpool pings a connection idle for more than a second), so the probe
// cut the ping and pgxpool destroyed a healthy connection: a new connect
// every 5 s for a database in another region.
func TestPoolProbeKeepsSlowConnections(t *testing.T) {
	u, proxy := integration.ProxyURL(t, integration.PostgresDSN(t))
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	// Every acquire pings, as one of a connection idle for over a second.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	var connects, closes atomic.Int64
	cfg.AfterConnect = func(context.Context, *pgx.Conn) error { connects.Add(1); return nil }
	cfg.BeforeClose = func(*pgx.Conn) { closes.Add(1) }
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// A connect cut by a cancel, as the pool's Close cuts one.
	cut, stop := context.WithCancel(context.Background())
	stop()
	_, cutErr := pgconn.Connect(cut, integration.PostgresDSN(t))
	var connectErr *pgconn.ConnectError
	if !errors.As(cutErr, &connectErr) || !errors.Is(cutErr, context.Canceled) {
		t.Fatalf("cancelled connect: %v; want a *pgconn.ConnectError wrapping context.Canceled", cutErr)
	}

	conn, err := pool.Acquire(ctx) // the pool's one connection
	if err != nil {
		t.Fatal(err)
	}
	if pgretry.ClosedBy(pool, cutErr) {
		t.Error("ClosedBy with the pool's one connection in use: true, want false")
	}
	conn.Release()

	proxy.SetLatency(300 * time.Millisecond)
	if pgretry.ClosedBy(pool, cutErr) {
		t.Error("ClosedBy of an open pool behind a slow link: true, want false")
	}
	// Wait for the probe's connection (its ping finishing) and use it.
	conn, err = pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("acquire after the probe: %v", err)
	}
	if err := conn.Ping(ctx); err != nil {
		t.Fatalf("ping after the probe: %v", err)
	}
	conn.Release()
	if n, c := connects.Load(), closes.Load(); n != 1 || c != 0 {
		t.Errorf("%d connects and %d closes after a probe over a slow link, want 1 and 0 (the probe destroyed a healthy connection)", n, c)
	}

	pool.Close()
	if !pgretry.ClosedBy(pool, cutErr) {
		t.Error("ClosedBy of a closed pool: false, want true")
	}
}

// TestPoolProbeKeepsConnectionsOfSlowHooks: PoolClosed takes an open pool
// for open without destroying a healthy connection when the application's
// BeforeAcquire hook makes a round trip that takes longer than the probe's
// 100 ms (2 x 300 ms through a proxy). Before, the probe's acquire was
// cancelled after 100 ms, and pgxpool gives the hook the acquire's context:
// the cancel cut the hook's statement, which closes the connection, and
// the hook's failure destroyed it, one healthy connection every 5 s (the
// LISTEN watcher's period) wherever a round trip takes longer.
func TestPoolProbeKeepsConnectionsOfSlowHooks(t *testing.T) {
	u, proxy := integration.ProxyURL(t, integration.PostgresDSN(t))
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	var connects, closes atomic.Int64
	cfg.AfterConnect = func(context.Context, *pgx.Conn) error { connects.Add(1); return nil }
	cfg.BeforeClose = func(*pgx.Conn) { closes.Add(1) }
	// A hook as applications write them: a round trip to check the
	// connection (or to set a role) before it is handed out. Deprecated in
	// pgx for PrepareConn, but still what many applications set.
	//lint:ignore SA1019 the deprecated hook is the one under test
	cfg.BeforeAcquire = func(ctx context.Context, conn *pgx.Conn) bool {
		_, err := conn.Exec(ctx, "SELECT 1")
		return err == nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil { // the pool's one connection, made
		t.Fatal(err)
	}

	proxy.SetLatency(300 * time.Millisecond)
	if pgretry.PoolClosed(pool) {
		t.Error("PoolClosed of an open pool whose BeforeAcquire hook is slow: true, want false")
	}
	// Wait for the probe's connection (its hook finishing) and use it.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("acquire after the probe: %v", err)
	}
	if err := conn.Ping(ctx); err != nil {
		t.Fatalf("ping after the probe: %v", err)
	}
	conn.Release()
	if n, c := connects.Load(), closes.Load(); n != 1 || c != 0 {
		t.Errorf("%d connects and %d closes after a probe through a slow hook, want 1 and 0 (the probe destroyed a healthy connection)", n, c)
	}

	pool.Close()
	if !pgretry.PoolClosed(pool) {
		t.Error("PoolClosed of a closed pool: false, want true")
	}
}

// TestClosedByMultiHostConnectCut: a connect to several hosts (host=a,b, as
// for a primary and a standby) joins the error of each host, and the first
// may have run out of its connect_timeout (a deadline) before the pool's
// Close cut the connect to the next with a cancel: that pool is closed, and
// ClosedBy says so. Before, any deadline beside the cancel ruled out the
// probe, so the broker said sdk.ErrUnavailable (a Worker backed off and
// retried) and the outbox relay logged a database outage for a pool the
// application had closed. The two hosts are silent servers (they accept
// and never answer), as a primary cut off by the network would be.
func TestClosedByMultiHostConnectCut(t *testing.T) {
	hosts, dial, dialedSecond := integration.TwoSilentHosts(t)
	cfg, err := pgxpool.ParseConfig("postgres://postgres@" + hosts + "/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = time.Second // each host's own limit
	cfg.ConnConfig.DialFunc = dial
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	got := make(chan error, 1)
	go func() {
		conn, err := pool.Acquire(context.Background())
		if err == nil {
			conn.Release()
		}
		got <- err
	}()
	select {
	case <-dialedSecond: // the first host timed out; the second waits for its reply
	case <-time.After(30 * time.Second):
		t.Fatal("the pool never tried the second host")
	}
	pool.Close() // cuts the connect to the second host with a cancel
	err = <-got
	if !errors.Is(err, context.Canceled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("connect to a timed-out host, then one cut by Close: %v; want an error joining a deadline and a cancel", err)
	}
	if !pgretry.ClosedBy(pool, err) {
		t.Errorf("ClosedBy(closed pool, %v) = false, want true", err)
	}
}

// TestPoolProbeAddsNoConnectToOneUnderWay: PoolClosed on an open pool with
// no idle connection, whose database accepts and never answers (no
// connect_timeout), starts at most one connect, however often it is asked:
// a probe finds the connect of the one before still under way and cannot
// tell, without a connect of its own. Before, each probe's acquire started
// a connect that went on beyond it, holding a slot of the pool for good,
// so the LISTEN watcher's probe every 5 s filled an idle application's
// pool with hung connects. A closed pool it still reports closed.
func TestPoolProbeAddsNoConnectToOneUnderWay(t *testing.T) {
	cfg, err := pgxpool.ParseConfig("postgres://postgres@" + integration.SilentServer(t) + "/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 3
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // cuts the connects under way; runs before the server's cleanup
	for i := range 3 {
		if pgretry.PoolClosed(pool) {
			t.Fatalf("probe %d: PoolClosed of an open pool on a silent server: true, want false", i+1)
		}
	}
	if n := pool.Stat().ConstructingConns(); n > 1 {
		t.Errorf("%d connects under way after 3 probes of a pool on a silent server, want at most 1 (each probe added a hung connect)", n)
	}
	pool.Close()
	if !pgretry.PoolClosed(pool) {
		t.Error("PoolClosed of a closed pool: false, want true")
	}
}

// TestPoolProbeWaitsOutConnectCutByClose: PoolClosed asked while the
// pool's Close is cutting a connect under way (the application's
// BeforeConnect hook takes 50 ms to give up after the cancel) waits for the
// connect to end rather than take the pool for open, and reports it closed.
func TestPoolProbeWaitsOutConnectCutByClose(t *testing.T) {
	cfg, err := pgxpool.ParseConfig("postgres://postgres@" + integration.SilentServer(t) + "/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	started, cut := make(chan struct{}), make(chan struct{})
	cfg.BeforeConnect = func(ctx context.Context, _ *pgx.ConnConfig) error {
		close(started)
		<-ctx.Done()
		close(cut)
		time.Sleep(50 * time.Millisecond)
		return ctx.Err()
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	acquired := make(chan error, 1)
	go func() {
		conn, err := pool.Acquire(context.Background())
		if err == nil {
			conn.Release()
		}
		acquired <- err
	}()
	<-started
	closed := make(chan struct{})
	go func() { pool.Close(); close(closed) }()
	<-cut // the pool is closed; its connect is still under way
	if n := pool.Stat().ConstructingConns(); n != 1 {
		t.Fatalf("%d connects under way after Close cut the hook, want 1", n)
	}
	if !pgretry.PoolClosed(pool) {
		t.Error("PoolClosed of a pool closed while a connect was under way: false, want true")
	}
	<-closed
	if err := <-acquired; !errors.Is(err, context.Canceled) {
		t.Errorf("acquire cut by Close: %v, want a cancel", err)
	}
}
