package pgstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
)

// deadPool returns a pool of n connections tagged appName whose backends
// were all terminated with pg_terminate_backend while idle: the pool still
// holds them. It never pings on acquire, so the dead connections are handed
// out whatever the machine's speed (pgxpool pings only those idle > 1s).
func deadPool(t *testing.T, e *env, appName string, n int32) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	cfg.MaxConns, cfg.MinConns = n, 0
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Open all n connections, then put them back idle.
	var conns []*pgxpool.Conn
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := pool.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, c := range conns {
		c.Release()
	}
	// Terminate only this test's backends, and wait until they are gone.
	var killed int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != int(n) {
		t.Fatalf("terminated %d backends of %s, want %d", killed, appName, n)
	}
	for {
		var left int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d backends of %s never went away", left, appName)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if st := pool.Stat(); st.IdleConns() != n {
		t.Fatalf("pool holds %d idle connections, want %d dead ones", st.IdleConns(), n)
	}
	return pool
}

// Issue 11 item 6: after pg_terminate_backend the pool hands out dead
// connections; a transactional-mode Begin must take another one instead of
// failing the job (and spending an attempt).
func TestHardening6_BeginAfterTerminatedBackends(t *testing.T) {
	e := newEnv(t)
	pool := deadPool(t, e, "berth-idem-term-"+randSuffix(), 4)
	store, err := pgstore.New(pool, pgstore.Options{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := idempotency.Claim{Key: "term:1", JobType: "t", Owner: "o", Lease: time.Minute, Retention: time.Hour}
	tx, out, _, err := store.Begin(ctx, c)
	if err != nil {
		t.Fatalf("Begin on a pool of terminated connections: %v", err)
	}
	if out != idempotency.Acquired {
		t.Fatalf("Begin = %v, want Acquired", out)
	}
	if err := tx.Commit(ctx, idempotency.Result{}); err != nil {
		t.Fatal(err)
	}
	rec, err := store.Get(ctx, c.Key)
	if err != nil || rec.Status != idempotency.StatusCompleted {
		t.Fatalf("key after commit: %+v, %v", rec, err)
	}
}
