package concurrency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/fence"
	"github.com/berthq/berth/concurrency/internal/testenv"
	"github.com/berthq/berth/concurrency/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestFencedReadModifyWrite: what a fencing token covers in a
// read-modify-write of a counter. Holder A takes the lock and reads; its lock
// expires (a pause past the TTL, no watchdog) and holder B takes it with a
// later token.
//
// Read, then fenced write: B reads before A writes; A's fenced write goes in
// (no later token has written yet), then B's, computed from a read made
// before A's write. A's increment is lost and no token was refused: the
// test asserts that it is, as the fence package doc warns. (This is the
// pattern TestLostUpdate used to show as the cure.)
//
// Check, then read, then write, in one transaction (the fence package doc's
// read-modify-write): A's Check records its token and holds the row until A
// commits; B's Check waits for that, so B reads A's increment. Both land.
func TestFencedReadModifyWrite(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	shortLocks, err := redislock.New(rdb, redislock.Options{Prefix: prefix, TTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	locks, err := redislock.New(rdb, redislock.Options{Prefix: prefix, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f, err := fence.New(fence.Options{Table: "counters"})
	if err != nil {
		t.Fatal(err)
	}
	table := func(t *testing.T) *pgxpool.Pool {
		pool, _ := pgtest.Schema(t, 4)
		pgtest.Exec(t, pool,
			`CREATE TABLE counters (id bigint PRIMARY KEY, n bigint NOT NULL, fence_token bigint)`,
			`INSERT INTO counters (id, n) VALUES (1, 0)`)
		return pool
	}
	read := func(t *testing.T, db fence.DB) int64 {
		t.Helper()
		var n int64
		if err := db.QueryRow(ctx, "SELECT n FROM counters WHERE id = 1").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// takeOver returns B's lock on resource once A's has expired.
	takeOver := func(t *testing.T, resource string, a *redislock.Lock) *redislock.Lock {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			b, err := locks.Obtain(ctx, resource)
			if err == nil {
				if b.Token() <= a.Token() {
					t.Fatalf("B's token %d not above A's %d", b.Token(), a.Token())
				}
				t.Cleanup(func() { _ = b.Release(context.Background()) })
				return b
			}
			if !errors.Is(err, redislock.ErrBusy) || time.Now().After(deadline) {
				t.Fatalf("B's Obtain: %v", err)
			}
			time.Sleep(5 * time.Millisecond) // until A's lock expires
		}
	}

	t.Run("read then fenced write loses an update", func(t *testing.T) {
		pool := table(t)
		a, err := shortLocks.Obtain(ctx, "counter:rw")
		if err != nil {
			t.Fatal(err)
		}
		nA := read(t, pool)
		b := takeOver(t, "counter:rw", a)
		nB := read(t, pool)
		if err := f.Update(ctx, pool, 1, a.Token(), map[string]any{"n": nA + 1}); err != nil {
			t.Fatalf("A's fenced write: %v", err)
		}
		if err := f.Update(ctx, pool, 1, b.Token(), map[string]any{"n": nB + 1}); err != nil {
			t.Fatalf("B's fenced write: %v", err)
		}
		if n := read(t, pool); n != 1 {
			t.Fatalf("n = %d, want 1: B's write, from its read before A's, overwrote A's increment", n)
		}
	})

	t.Run("check, read, write in one transaction loses none", func(t *testing.T) {
		pool := table(t)
		a, err := shortLocks.Obtain(ctx, "counter:crw")
		if err != nil {
			t.Fatal(err)
		}
		txA, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = txA.Rollback(ctx) }()
		if err := f.Check(ctx, txA, 1, a.Token()); err != nil {
			t.Fatalf("A's Check: %v", err)
		}
		nA := read(t, txA)
		var pidA int32
		if err := txA.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pidA); err != nil {
			t.Fatal(err)
		}
		b := takeOver(t, "counter:crw", a)
		bDone := make(chan error, 1)
		go func() {
			bDone <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := f.Check(ctx, tx, 1, b.Token()); err != nil {
					return err
				}
				var n int64
				if err := tx.QueryRow(ctx, "SELECT n FROM counters WHERE id = 1").Scan(&n); err != nil {
					return err
				}
				return f.Update(ctx, tx, 1, b.Token(), map[string]any{"n": n + 1})
			})
		}()
		// B's Check waits for A's transaction: A writes only once B is
		// blocked on it, so that B's read could come before A's write if
		// the Check did not hold it back.
		deadline := time.Now().Add(time.Minute)
		for {
			var waiting int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", pidA).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			if waiting > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("B never waited for A's transaction")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := f.Update(ctx, txA, 1, a.Token(), map[string]any{"n": nA + 1}); err != nil {
			t.Fatalf("A's fenced write: %v", err)
		}
		if err := txA.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-bDone:
			if err != nil {
				t.Fatalf("B's transaction: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("B's transaction did not finish")
		}
		if n := read(t, pool); n != 2 {
			t.Fatalf("n = %d, want 2: an increment was lost", n)
		}
	})
}
