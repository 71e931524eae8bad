package optimistic_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/optimistic"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// raceWith stages a race against a transaction on pool: it runs hold in
// the transaction, starts run, waits until run's statement waits for the
// transaction, then runs then (if not empty: a statement that completes
// the cycle of a deadlock, and returns once run's statement was chosen as
// the victim), commits (or rolls back) and returns run's error.
//
// run's statement has waited longest, so its deadlock check
// (deadlock_timeout after it began waiting) normally finds the cycle
// first. On a loaded machine the holding transaction's check can come
// first; then it is the victim, run goes through, and the race is staged
// again with a fresh call of run (which must not depend on earlier calls).
func raceWith(t *testing.T, pool *pgxpool.Pool, hold, then string, commit bool, run func() error) error {
	t.Helper()
	for try := 1; ; try++ {
		err, holderLost := raceOnce(t, pool, hold, then, commit, run)
		if !holderLost {
			return err
		}
		if try == 5 {
			t.Fatalf("staging: the holding transaction, not the statement under test, was the deadlock victim %d times", try)
		}
		t.Logf("staging: the holding transaction was the deadlock victim; staging again")
	}
}

func raceOnce(t *testing.T, pool *pgxpool.Pool, hold, then string, commit bool, run func() error) (_ error, holderLost bool) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	started, returned := false, false
	defer func() {
		_ = tx.Rollback(ctx)
		if started && !returned {
			<-done // run's statement ends once the transaction does
		}
	}()
	// The statement under test must be the deadlock's victim: PostgreSQL
	// aborts the waiter whose deadlock_timeout runs out first, and the
	// holder starts waiting after it, but on a loaded machine its check
	// could still come first. A retry after the holder lost cannot undo a
	// statement under test that ran in the caller's transaction (it keeps
	// the locks it took, the trigger's advisory lock among them), and the
	// next hold then waited on that transaction for ever. The holder's
	// deadlock_timeout is made long (superuser only: where it cannot be
	// set, staging retries as before), and its lock_timeout turns such a
	// wait into an error instead of a hang.
	if sp, err := tx.Begin(ctx); err == nil {
		if _, err := sp.Exec(ctx, `SET LOCAL deadlock_timeout = '60s'`); err == nil {
			_ = sp.Commit(ctx)
		} else {
			_ = sp.Rollback(ctx)
		}
	}
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '30s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, hold); err != nil {
		t.Fatal(err)
	}
	pid := tx.Conn().PgConn().PID()
	started = true
	go func() { done <- run() }()
	for waiting := 0; waiting == 0; {
		select {
		case err := <-done:
			returned = true
			t.Fatalf("staging: the statement under test did not wait for the holding transaction: %v", err)
		default:
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if then != "" {
		if _, err := tx.Exec(ctx, then); err != nil {
			if sqlState(err) != "40P01" {
				t.Fatal(err)
			}
			_ = tx.Rollback(ctx)
			returned = true
			<-done
			return nil, true
		}
	}
	if commit {
		err = tx.Commit(ctx)
	} else {
		err = tx.Rollback(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	returned = true
	return <-done, false
}

// sqlState returns the SQLSTATE of the *pgconn.PgError err wraps, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestSerializableConflictSaysWhatHappened: at SERIALIZABLE (the
// database's default isolation), an Update run as its own transaction
// waits for a concurrent write of its row that leaves the version alone (a
// blind write by another code path); the commit fails the Update with a
// serialization failure, and the row's version is still the one expected.
// The conflict read "expected version 1, found 1" — versions that match,
// no hint of the serialization failure. It must say what happened, carry
// the SQLSTATE, and stay a conflict the Retrier retries.
func TestSerializableConflictSaysWhatHappened(t *testing.T) {
	ctx := context.Background()
	pool, schema := pgtest.Schema(t, 4)
	pgtest.Exec(t, pool, `CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL, version bigint NOT NULL DEFAULT 1)`,
		`INSERT INTO orders (id, amount) VALUES (1, 0)`)
	tbl, err := optimistic.New(optimistic.Options{Table: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	ser := pgtest.Connect(t, isolationDSN(t, "serializable"), schema, false, 2)
	const blind = `UPDATE orders SET amount = amount + 5 WHERE id = 1` // version unchanged

	err = raceWith(t, pool, blind, "", true, func() error {
		_, err := tbl.Update(ctx, ser, 1, 1, map[string]any{"amount": 7})
		return err
	})
	var ce *optimistic.ConflictError
	if !errors.Is(err, optimistic.ErrVersionConflict) || !errors.As(err, &ce) {
		t.Fatalf("Update that lost the race at SERIALIZABLE: %v; want a version conflict", err)
	}
	msg := err.Error()
	if sqlState(err) != "40001" || ce.Expected != 1 || ce.Actual != 1 ||
		strings.Contains(msg, "expected version 1, found 1") ||
		!strings.Contains(msg, "serialization failure (SQLSTATE 40001)") || !strings.Contains(msg, "version conflict") {
		t.Fatalf("conflict %q (SQLSTATE %q, expected %d, actual %d): want a message naming the serialization failure detected as a conflict, SQLSTATE 40001, expected 1 actual 1",
			msg, sqlState(err), ce.Expected, ce.Actual)
	}

	// Retrier.Do reloads and re-applies: both changes land.
	var r optimistic.Retrier
	err = raceWith(t, pool, blind, "", true, func() error {
		return r.Do(ctx, func(ctx context.Context) error {
			var amount int64
			v, err := tbl.Get(ctx, ser, 1, []string{"amount"}, &amount)
			if err != nil {
				return err
			}
			_, err = tbl.Update(ctx, ser, 1, v, map[string]any{"amount": amount + 10})
			return err
		})
	})
	if err != nil || r.Conflicts() != 1 {
		t.Fatalf("Do: %v after %d conflicts; want nil after 1", err, r.Conflicts())
	}
	var amount int64
	if v, err := tbl.Get(ctx, pool, 1, []string{"amount"}, &amount); err != nil || v != 2 || amount != 5+5+10 {
		t.Fatalf("row: version %d amount %d (%v); want 2 and 20", v, amount, err)
	}
}

// TestDeadlockIsClassifiedLikeSerializationFailure: Get and Update classify
// a deadlock (SQLSTATE 40P01) and a serialization failure alike. Run as its
// own transaction (a pool, a connection not in a transaction) the statement
// that was the deadlock victim was rolled back with no effect: a lost race,
// a conflict Retrier.Do retries. In the caller's transaction it aborted the
// transaction and comes back as the database error, not a conflict. Get
// returned a plain error even on a pool, and so did Update for a deadlock.
//
// The deadlocks are real. A Get holds the table's lock and waits for its
// index, held by a REINDEX that then asks for the table. An Update holds its
// row and waits, in a trigger, for an advisory lock held by a transaction
// that then updates the row.
func TestDeadlockIsClassifiedLikeSerializationFailure(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.Schema(t, 6)
	gate := rand.Int64()
	pgtest.Exec(t, pool,
		`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL, version bigint NOT NULL DEFAULT 1)`,
		`INSERT INTO orders (id, amount) VALUES (1, 0)`,
		fmt.Sprintf(`CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN PERFORM pg_advisory_xact_lock(%d); RETURN NEW; END $$`, gate),
		`CREATE TRIGGER gate BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION gate()`)
	tbl, err := optimistic.New(optimistic.Options{Table: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()

	getDeadlock := func(t *testing.T, db optimistic.DB) error {
		return raceWith(t, pool, `REINDEX INDEX orders_pkey`, `LOCK TABLE orders IN ACCESS EXCLUSIVE MODE`, false, func() error {
			var amount int64
			_, err := tbl.Get(ctx, db, 1, []string{"amount"}, &amount)
			return err
		})
	}
	updateDeadlock := func(t *testing.T, db optimistic.DB) error {
		return raceWith(t, pool, fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d)`, gate), `UPDATE orders SET amount = amount WHERE id = 1`, false, func() error {
			var amount int64
			v, err := tbl.Get(ctx, pool, 1, []string{"amount"}, &amount) // the holder has no lock it needs
			if err != nil {
				return err
			}
			_, err = tbl.Update(ctx, db, 1, v, map[string]any{"amount": 7})
			return err
		})
	}

	for _, c := range []struct {
		name string
		db   optimistic.DB
	}{{"pool", pool}, {"conn", conn}} {
		t.Run(c.name, func(t *testing.T) {
			err := getDeadlock(t, c.db)
			var ce *optimistic.ConflictError
			if !errors.As(err, &ce) || ce.Op != optimistic.OpGet || sqlState(err) != "40P01" ||
				!strings.Contains(err.Error(), "deadlock (SQLSTATE 40P01)") {
				t.Errorf("Get, deadlock victim as its own transaction: %v; want a conflict naming the deadlock, SQLSTATE 40P01", err)
			}
			err = updateDeadlock(t, c.db)
			if !errors.As(err, &ce) || ce.Op != optimistic.OpUpdate || ce.Expected != ce.Actual || sqlState(err) != "40P01" ||
				!strings.Contains(err.Error(), "deadlock (SQLSTATE 40P01)") {
				t.Errorf("Update, deadlock victim as its own transaction: %v; want a conflict naming the deadlock, the version unchanged, SQLSTATE 40P01", err)
			}
		})
	}

	t.Run("Retrier", func(t *testing.T) {
		var r *optimistic.Retrier
		var reads *atomic.Int64
		err := raceWith(t, pool, `REINDEX INDEX orders_pkey`, `LOCK TABLE orders IN ACCESS EXCLUSIVE MODE`, false, func() error {
			r, reads = &optimistic.Retrier{}, new(atomic.Int64)
			return r.Do(ctx, func(ctx context.Context) error {
				reads.Add(1)
				var amount int64
				v, err := tbl.Get(ctx, pool, 1, []string{"amount"}, &amount)
				if err != nil {
					return err
				}
				_, err = tbl.Update(ctx, pool, 1, v, map[string]any{"amount": amount + 1})
				return err
			})
		})
		if err != nil || r.Conflicts() != 1 || reads.Load() != 2 {
			t.Fatalf("Do after a deadlocked Get: %v, %d conflicts, %d reads; want nil, 1, 2", err, r.Conflicts(), reads.Load())
		}
	})

	t.Run("caller's transaction", func(t *testing.T) {
		for _, c := range []struct {
			name  string
			stage func(*testing.T, optimistic.DB) error
		}{{"Get", getDeadlock}, {"Update", updateDeadlock}} {
			t.Run(c.name, func(t *testing.T) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback(ctx) }()
				err = c.stage(t, tx)
				if errors.Is(err, optimistic.ErrVersionConflict) || sqlState(err) != "40P01" {
					t.Errorf("%s, deadlock victim in the caller's transaction: %v; want the deadlock as a database error, not a conflict", c.name, err)
				}
			})
		}
	})
}

// TestConcurrentIncrementsLoseNothing: many workers increment one counter
// at READ COMMITTED (the default), each a Get and an Update in Retrier.Do,
// on a pool or in a transaction per increment. At READ COMMITTED a waiting
// UPDATE re-checks its WHERE clause against the row the other committed, so
// a stale version matches no row: no increment is lost, the version counts
// every one, and every attempt that did not land was counted as a conflict.
func TestConcurrentIncrementsLoseNothing(t *testing.T) {
	for _, inTx := range []bool{false, true} {
		t.Run(map[bool]string{false: "pool", true: "transaction per increment"}[inTx], func(t *testing.T) {
			ctx := context.Background()
			pool, tbl := setup(t)
			const workers, perWorker = 16, 25
			r := &optimistic.Retrier{MaxAttempts: 10_000}
			var attempts atomic.Int64
			inc := func(ctx context.Context, db optimistic.DB) error {
				return r.Do(ctx, func(ctx context.Context) error {
					attempts.Add(1)
					var amount int64
					v, err := tbl.Get(ctx, db, 1, []string{"amount"}, &amount)
					if err != nil {
						return err
					}
					_, err = tbl.Update(ctx, db, 1, v, map[string]any{"amount": amount + 1})
					return err
				})
			}
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			start := make(chan struct{})
			for range workers {
				wg.Go(func() {
					<-start
					for range perWorker {
						var err error
						if inTx {
							err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return inc(ctx, tx) })
						} else {
							err = inc(ctx, pool)
						}
						if err != nil {
							errs <- err
							return
						}
					}
				})
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			var amount int64
			v, err := tbl.Get(ctx, pool, 1, []string{"amount"}, &amount)
			if err != nil || amount != workers*perWorker || v != 1+workers*perWorker {
				t.Fatalf("amount %d version %d (%v); want %d and %d: an update was lost", amount, v, err, workers*perWorker, 1+workers*perWorker)
			}
			if lost := attempts.Load() - workers*perWorker; lost != r.Conflicts() {
				t.Errorf("%d attempts did not land but %d conflicts were counted", lost, r.Conflicts())
			}
			t.Logf("%d attempts, %d conflicts", attempts.Load(), r.Conflicts())
		})
	}
}

// With Backoff, Do waits between attempts, and a ctx that ends during the
// wait stops it at once with ctx.Err(), not after the wait (an hour here:
// a wait that ignored ctx would run past the test's timeout).
func TestRetrierBackoffStopsWhenCtxEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := optimistic.Retrier{MaxAttempts: 3, Backoff: time.Hour}
	r.OnConflict = func(context.Context, int, error) {
		time.AfterFunc(10*time.Millisecond, cancel) // most likely while Do waits
	}
	calls := 0
	err := r.Do(ctx, func(context.Context) error {
		calls++
		return &optimistic.ConflictError{Table: "t", Key: 1, Expected: 1, Actual: 2}
	})
	if !errors.Is(err, context.Canceled) || calls != 1 || r.Conflicts() != 1 {
		t.Fatalf("Do = %v after %d calls, %d conflicts; want context.Canceled after 1, 1", err, calls, r.Conflicts())
	}
}
