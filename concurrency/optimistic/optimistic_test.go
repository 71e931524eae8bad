package optimistic_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/optimistic"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func setup(t *testing.T) (*pgxpool.Pool, *optimistic.Table) {
	t.Helper()
	pool, _ := pgtest.Schema(t, 8)
	pgtest.Exec(t, pool,
		`CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, amount bigint NOT NULL, version bigint NOT NULL DEFAULT 1)`,
		`INSERT INTO orders (id, status, amount) VALUES (1, 'pending', 0)`)
	tbl, err := optimistic.New(optimistic.Options{Table: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	return pool, tbl
}

func TestNewRejectsBadIdentifiers(t *testing.T) {
	for _, o := range []optimistic.Options{
		{},
		{Table: "orders x"},
		{Table: "orders", VersionColumn: `v"`},
		{Table: "orders", KeyColumn: "id; --"},
	} {
		if _, err := optimistic.New(o); !errors.Is(err, sqlident.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", o, err)
		}
	}
	if _, err := optimistic.New(optimistic.Options{Table: "orders", KeyColumn: "v", VersionColumn: "v"}); err == nil {
		t.Error("same key and version column accepted")
	}
}

func TestUpdate(t *testing.T) {
	pool, tbl := setup(t)
	ctx := context.Background()
	var status string
	v, err := tbl.Get(ctx, pool, 1, []string{"status"}, &status)
	if err != nil || v != 1 || status != "pending" {
		t.Fatalf("Get = %d %q %v", v, status, err)
	}
	next, err := tbl.Update(ctx, pool, 1, v, map[string]any{"status": "paid", "amount": 42})
	if err != nil || next != 2 {
		t.Fatalf("Update = %d, %v; want 2, nil", next, err)
	}
	// The stale version conflicts and changes nothing.
	_, err = tbl.Update(ctx, pool, 1, v, map[string]any{"status": "pending"})
	var ce *optimistic.ConflictError
	if !errors.Is(err, optimistic.ErrVersionConflict) || !errors.As(err, &ce) || ce.Expected != 1 || ce.Actual != 2 {
		t.Fatalf("stale Update = %v, want conflict expected 1 actual 2", err)
	}
	var amount int64
	if v, err := tbl.Get(ctx, pool, 1, []string{"status", "amount"}, &status, &amount); err != nil || v != 2 || status != "paid" || amount != 42 {
		t.Fatalf("after: %d %q %d %v", v, status, amount, err)
	}
	if _, err := tbl.Update(ctx, pool, 7, 1, map[string]any{"status": "x"}); !errors.Is(err, optimistic.ErrNotFound) {
		t.Errorf("missing row: %v, want ErrNotFound", err)
	}
	if _, err := tbl.Get(ctx, pool, 7, nil); !errors.Is(err, optimistic.ErrNotFound) {
		t.Errorf("Get missing row: %v, want ErrNotFound", err)
	}
	if _, err := tbl.Update(ctx, pool, 1, 2, map[string]any{"status = 'x', amount": 1}); !errors.Is(err, sqlident.ErrInvalid) {
		t.Errorf("injected column: %v, want ErrInvalid", err)
	}
	if _, err := tbl.Update(ctx, pool, 1, 2, map[string]any{"version": 9}); err == nil {
		t.Error("setting the version column accepted")
	}
	if _, err := tbl.Get(ctx, pool, 1, []string{"status"}); err == nil {
		t.Error("Get with fewer destinations than columns accepted")
	}
}

// Two workers read the same version; the one that writes second conflicts,
// and the Retrier reloads and re-applies, so both increments land.
func TestRetrierReappliesAfterConflict(t *testing.T) {
	pool, tbl := setup(t)
	ctx := context.Background()
	var r optimistic.Retrier
	var conflicts []int
	var mu sync.Mutex
	r.OnConflict = func(_ context.Context, attempt int, err error) {
		mu.Lock()
		defer mu.Unlock()
		conflicts = append(conflicts, attempt)
	}
	read := make(chan struct{}, 2)
	proceed := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			first := true
			errs <- r.Do(ctx, func(ctx context.Context) error {
				var amount int64
				v, err := tbl.Get(ctx, pool, 1, []string{"amount"}, &amount)
				if err != nil {
					return err
				}
				if first { // both read before either writes
					first = false
					read <- struct{}{}
					<-proceed
				}
				_, err = tbl.Update(ctx, pool, 1, v, map[string]any{"amount": amount + 1})
				return err
			})
		})
	}
	<-read
	<-read
	close(proceed)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var amount int64
	if _, err := tbl.Get(ctx, pool, 1, []string{"amount"}, &amount); err != nil || amount != 2 {
		t.Fatalf("amount = %d (%v), want 2", amount, err)
	}
	if r.Conflicts() != 1 || len(conflicts) != 1 || conflicts[0] != 1 {
		t.Errorf("conflicts = %d, hook saw %v; want 1 at attempt 1", r.Conflicts(), conflicts)
	}
}

func TestRetrierIsBounded(t *testing.T) {
	r := optimistic.Retrier{MaxAttempts: 3}
	calls := 0
	err := r.Do(context.Background(), func(context.Context) error {
		calls++
		return &optimistic.ConflictError{Table: "t", Key: 1, Expected: 1, Actual: 2}
	})
	var ex *optimistic.ExhaustedError
	if !errors.As(err, &ex) || ex.Attempts != 3 || !errors.Is(err, optimistic.ErrVersionConflict) {
		t.Fatalf("Do = %v, want ExhaustedError after 3 attempts", err)
	}
	if calls != 3 || r.Conflicts() != 3 {
		t.Errorf("calls = %d, conflicts = %d; want 3, 3", calls, r.Conflicts())
	}
	other := errors.New("boom")
	if err := r.Do(context.Background(), func(context.Context) error { return other }); err != other {
		t.Errorf("non-conflict error = %v, want it returned as is", err)
	}
}

func ExampleRetrier() {
	var r optimistic.Retrier // zero value: 5 attempts
	versions := []int64{1, 2}
	err := r.Do(context.Background(), func(ctx context.Context) error {
		// Reload the row, re-apply the change, write with the version read.
		v := versions[0]
		versions = versions[1:]
		if v == 1 { // someone else wrote version 2 meanwhile
			return &optimistic.ConflictError{Table: "orders", Key: 1, Expected: 1, Actual: 2}
		}
		return nil
	})
	fmt.Println(err, r.Conflicts())
	// Output: <nil> 1
}

// repeatableReadDSN is the test database's DSN with every transaction
// REPEATABLE READ, a statement run outside a transaction included.
func repeatableReadDSN(t *testing.T) string { return isolationDSN(t, "repeatable read") }

// isolationDSN is the test database's DSN with every transaction at level
// (default_transaction_isolation), a statement run outside a transaction
// included.
func isolationDSN(t *testing.T, level string) string {
	dsn := integration.PostgresDSN(t)
	switch {
	case !strings.Contains(dsn, "://"):
		return dsn + " default_transaction_isolation='" + level + "'"
	case strings.Contains(dsn, "?"):
		return dsn + "&default_transaction_isolation=" + url.PathEscape(level)
	default:
		return dsn + "?default_transaction_isolation=" + url.PathEscape(level)
	}
}

// blockUntilWaiting holds the row with id 1 in an uncommitted update
// (amount 5, version 2) and returns after run, started meanwhile, waits
// for it; then commits the update.
func blockUntilWaiting(t *testing.T, pool *pgxpool.Pool, run func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `UPDATE orders SET amount = 5, version = version + 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	pid := tx.Conn().PgConn().PID()
	go run()
	for waiting := 0; waiting == 0; {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSerializationFailureOutsideTxIsConflict: at REPEATABLE READ (or
// SERIALIZABLE) as the database's default isolation, an Update that waited
// for a concurrent update of its row fails with a serialization failure
// (SQLSTATE 40001), not zero rows. Outside a transaction that is the lost
// race and nothing else: the statement was its own transaction, so the
// Retrier may reload and re-apply. It came back as a plain database error,
// which Retrier.Do returned at once. Inside a transaction the failure
// aborts the transaction, and it stays an error to re-run the whole
// transaction with, not a conflict to retry in it.
func TestSerializationFailureOutsideTxIsConflict(t *testing.T) {
	ctx := context.Background()
	pool, schema := pgtest.Schema(t, 4)
	pgtest.Exec(t, pool, `CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL, version bigint NOT NULL DEFAULT 1)`)
	tbl, err := optimistic.New(optimistic.Options{Table: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	rr := pgtest.Connect(t, repeatableReadDSN(t), schema, false, 2)
	conn, err := rr.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, c := range []struct {
		name string
		db   optimistic.DB
	}{{"pool", rr}, {"conn", conn}} {
		t.Run(c.name, func(t *testing.T) {
			pgtest.Exec(t, pool, `DELETE FROM orders`, `INSERT INTO orders (id, amount) VALUES (1, 0)`)
			// The Update alone: a conflict with the row's new version.
			done := make(chan error, 1)
			blockUntilWaiting(t, pool, func() {
				_, err := tbl.Update(ctx, c.db, 1, 1, map[string]any{"amount": 7})
				done <- err
			})
			err := <-done
			var ce *optimistic.ConflictError
			if !errors.As(err, &ce) || ce.Expected != 1 || ce.Actual != 2 {
				t.Fatalf("Update that lost the race at REPEATABLE READ: %v; want a conflict expected 1 actual 2", err)
			}
			// Retrier.Do reloads and re-applies: both changes land.
			pgtest.Exec(t, pool, `DELETE FROM orders`, `INSERT INTO orders (id, amount) VALUES (1, 0)`)
			var r optimistic.Retrier
			blockUntilWaiting(t, pool, func() {
				done <- r.Do(ctx, func(ctx context.Context) error {
					var amount int64
					v, err := tbl.Get(ctx, c.db, 1, []string{"amount"}, &amount)
					if err != nil {
						return err
					}
					_, err = tbl.Update(ctx, c.db, 1, v, map[string]any{"amount": amount + 10})
					return err
				})
			})
			if err := <-done; err != nil || r.Conflicts() != 1 {
				t.Fatalf("Do: %v after %d conflicts; want nil after 1", err, r.Conflicts())
			}
			var amount int64
			if v, err := tbl.Get(ctx, pool, 1, []string{"amount"}, &amount); err != nil || v != 3 || amount != 15 {
				t.Fatalf("row: version %d amount %d (%v); want 3 and 15", v, amount, err)
			}
		})
	}
	// In a transaction: the serialization failure as is, not a conflict.
	pgtest.Exec(t, pool, `DELETE FROM orders`, `INSERT INTO orders (id, amount) VALUES (1, 0)`)
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var amount int64
	v, err := tbl.Get(ctx, tx, 1, []string{"amount"}, &amount) // the snapshot
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, pool, `UPDATE orders SET version = version + 1 WHERE id = 1`)
	_, err = tbl.Update(ctx, tx, 1, v, map[string]any{"amount": 1})
	var pgErr *pgconn.PgError
	if errors.Is(err, optimistic.ErrVersionConflict) || !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("Update in a REPEATABLE READ transaction after a concurrent update: %v; want the serialization failure, not a conflict", err)
	}
}
