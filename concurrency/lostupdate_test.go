package concurrency_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/fence"
	"github.com/berthq/berth/concurrency/internal/testenv"
	"github.com/berthq/berth/concurrency/optimistic"
	"github.com/berthq/berth/concurrency/redislock"
	"github.com/berthq/berth/concurrency/rowlock"
	"github.com/berthq/berth/concurrency/state"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "fenced-writer" { // re-executed by TestPausedLockHolderIsFenced
		helperProcess()
	}
	goleak.VerifyTestMain(m)
}

func counterTable(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, _ := pgtest.Schema(t, 6)
	pgtest.Exec(t, pool,
		`CREATE TABLE counters (id bigint PRIMARY KEY, n bigint NOT NULL, version bigint NOT NULL DEFAULT 1, fence_token bigint)`,
		`INSERT INTO counters (id, n) VALUES (1, 0)`)
	return pool
}

func readN(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), "SELECT n FROM counters WHERE id = 1").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLostUpdate shows the bug and each cure. Two workers read-modify-write
// one counter. With a blind write, both read 0 before either writes, and one
// increment is lost: the test asserts that it is. With each helper, the two
// workers run 40 increments each concurrently and none is lost.
func TestLostUpdate(t *testing.T) {
	ctx := context.Background()
	const workers, perWorker = 2, 40

	t.Run("blind write loses an update", func(t *testing.T) {
		pool := counterTable(t)
		var read sync.WaitGroup
		read.Add(workers)
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Go(func() {
				var n int64
				err := pool.QueryRow(ctx, "SELECT n FROM counters WHERE id = 1").Scan(&n)
				read.Done()
				read.Wait() // both have read before either writes
				if err == nil {
					_, err = pool.Exec(ctx, "UPDATE counters SET n = $1 WHERE id = 1", n+1)
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if n := readN(t, pool); n != 1 {
			t.Fatalf("n = %d after two blind increments from the same read, want 1 (one update lost)", n)
		}
	})

	// run starts the workers, each calling inc perWorker times, and checks
	// that every increment landed.
	run := func(t *testing.T, pool *pgxpool.Pool, inc func(ctx context.Context) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Go(func() {
				for range perWorker {
					if err := inc(ctx); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if n := readN(t, pool); n != workers*perWorker {
			t.Fatalf("n = %d, want %d: an update was lost", n, workers*perWorker)
		}
	}

	t.Run("row lock", func(t *testing.T) {
		pool := counterTable(t)
		l, err := rowlock.New(rowlock.Options{Table: "counters", Columns: []string{"n"}, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		run(t, pool, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var n int64
				if _, err := l.Lock(ctx, tx, 1, &n); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "UPDATE counters SET n = $1 WHERE id = 1", n+1)
				return err
			})
		})
	})

	t.Run("optimistic version", func(t *testing.T) {
		pool := counterTable(t)
		tbl, err := optimistic.New(optimistic.Options{Table: "counters"})
		if err != nil {
			t.Fatal(err)
		}
		r := &optimistic.Retrier{MaxAttempts: 1000}
		run(t, pool, func(ctx context.Context) error {
			return r.Do(ctx, func(ctx context.Context) error {
				var n int64
				v, err := tbl.Get(ctx, pool, 1, []string{"n"}, &n)
				if err != nil {
					return err
				}
				_, err = tbl.Update(ctx, pool, 1, v, map[string]any{"n": n + 1})
				return err
			})
		})
		t.Logf("%d version conflicts re-applied", r.Conflicts())
	})

	t.Run("redis lock with fencing", func(t *testing.T) {
		pool := counterTable(t)
		rdb, prefix := testenv.Redis(t)
		locks, err := redislock.New(rdb, redislock.Options{Prefix: prefix, TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		f, err := fence.New(fence.Options{Table: "counters"})
		if err != nil {
			t.Fatal(err)
		}
		run(t, pool, func(ctx context.Context) error {
			for {
				err := locks.Run(ctx, "counter:1", func(ctx context.Context, l *redislock.Lock) error {
					// Check, read, write, in one transaction: a read
					// before the Check is not fenced (TestFencedReadModifyWrite).
					return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if err := f.Check(ctx, tx, 1, l.Token()); err != nil {
							return err
						}
						var n int64
						if err := tx.QueryRow(ctx, "SELECT n FROM counters WHERE id = 1").Scan(&n); err != nil {
							return err
						}
						return f.Update(ctx, tx, 1, l.Token(), map[string]any{"n": n + 1})
					})
				})
				if !errors.Is(err, redislock.ErrBusy) {
					return err
				}
				time.Sleep(time.Millisecond)
			}
		})
	})

	t.Run("state transition", func(t *testing.T) {
		// The same bug on a status: a worker read "pending", another moved
		// the order to paid meanwhile, and the first writes what it decided
		// from its stale read.
		pool, _ := pgtest.Schema(t, 2)
		pgtest.Exec(t, pool,
			`CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL)`,
			`INSERT INTO orders VALUES (1, 'pending'), (2, 'pending')`)
		m, err := state.New(state.Options{Table: "orders", Transitions: map[string][]string{
			"pending": {"processing"}, "processing": {"paid"}, "paid": nil,
		}})
		if err != nil {
			t.Fatal(err)
		}
		status := func(id int) string {
			var s string
			if err := pool.QueryRow(ctx, "SELECT status FROM orders WHERE id = $1", id).Scan(&s); err != nil {
				t.Fatal(err)
			}
			return s
		}
		for id := 1; id <= 2; id++ {
			for _, to := range []string{"processing", "paid"} {
				if _, err := m.Transition(ctx, pool, id, to, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		// Blind: the stale worker's write moves order 1 backwards.
		if _, err := pool.Exec(ctx, "UPDATE orders SET status = 'processing' WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		if s := status(1); s != "processing" {
			t.Fatalf("blind stale write left %s, want the regression to processing", s)
		}
		// Guarded: the same stale decision is refused, permanently.
		_, err = m.Transition(ctx, pool, 2, "processing", nil)
		var te *state.TransitionError
		if !sdk.IsPermanent(err) || !errors.As(err, &te) || !te.Backward {
			t.Fatalf("guarded stale write = %v, want a permanent backward refusal", err)
		}
		if s := status(2); s != "paid" {
			t.Fatalf("guarded order is %s, want paid", s)
		}
	})
}
