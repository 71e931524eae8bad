package rowlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/rowlock"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, _ := pgtest.Schema(t, 4)
	pgtest.Exec(t, pool,
		`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL)`,
		`INSERT INTO orders VALUES (1, 10), (2, 20)`)
	return pool
}

func begin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func TestNewRejectsBadIdentifiers(t *testing.T) {
	for _, o := range []rowlock.Options{
		{},
		{Table: "orders; DROP TABLE orders"},
		{Table: `or"ders`},
		{Table: "a.b.c"},
		{Table: "orders", KeyColumn: "id--"},
		{Table: "orders", Columns: []string{"amount", "amount"}},
		{Table: "orders", Columns: []string{"1x"}},
	} {
		if _, err := rowlock.New(o); !errors.Is(err, sqlident.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", o, err)
		}
	}
	if _, err := rowlock.New(rowlock.Options{Table: "orders", Timeout: -time.Second}); err == nil {
		t.Error("negative Timeout accepted")
	}
	if _, err := rowlock.New(rowlock.Options{Table: "public.orders", Columns: []string{"amount"}}); err != nil {
		t.Errorf("schema-qualified table refused: %v", err)
	}
}

func TestLockReadsRowAndRestoresLockTimeout(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	l, err := rowlock.New(rowlock.Options{Table: "orders", Columns: []string{"amount"}, Timeout: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tx := begin(t, pool)
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '7s'"); err != nil {
		t.Fatal(err)
	}
	var amount int64
	if _, err := l.Lock(ctx, tx, 2, &amount); err != nil {
		t.Fatal(err)
	}
	if amount != 20 {
		t.Errorf("amount = %d, want 20", amount)
	}
	var lt string
	if err := tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&lt); err != nil {
		t.Fatal(err)
	}
	if lt != "7s" {
		t.Errorf("lock_timeout after Lock = %q, want the caller's 7s back", lt)
	}
}

func TestBusyIsRetryAfter(t *testing.T) {
	for _, noWait := range []bool{true, false} {
		name := map[bool]string{true: "nowait", false: "lock_timeout"}[noWait]
		t.Run(name, func(t *testing.T) {
			pool := setup(t)
			ctx := context.Background()
			var observed []error
			var mu sync.Mutex
			l, err := rowlock.New(rowlock.Options{
				Table: "orders", NoWait: noWait, Timeout: 50 * time.Millisecond, RetryDelay: 3 * time.Second,
				Observe: func(_ context.Context, table string, _ time.Duration, err error) {
					mu.Lock()
					defer mu.Unlock()
					observed = append(observed, err)
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			holder := begin(t, pool)
			if _, err := l.Lock(ctx, holder, 1); err != nil {
				t.Fatal(err)
			}
			waiter := begin(t, pool)
			_, err = l.Lock(ctx, waiter, 1)
			if !errors.Is(err, rowlock.ErrBusy) {
				t.Fatalf("second Lock = %v, want ErrBusy", err)
			}
			if c := sdk.Classify(err); c != sdk.ClassRetryAfter {
				t.Errorf("class = %q, want retry_after", c)
			}
			var ra *sdk.RetryAfterError
			if !errors.As(err, &ra) || ra.Delay != 3*time.Second {
				t.Errorf("RetryAfter = %+v, want delay 3s", ra)
			}
			var be *rowlock.BusyError
			if !errors.As(err, &be) || be.Table != "orders" || be.Key != 1 {
				t.Errorf("BusyError = %+v", be)
			}
			// Another row is free.
			other := begin(t, pool)
			if _, err := l.Lock(ctx, other, 2); err != nil {
				t.Errorf("other row: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(observed) != 3 || observed[0] != nil || !errors.Is(observed[1], rowlock.ErrBusy) || observed[2] != nil {
				t.Errorf("observed %v, want [nil busy nil]", observed)
			}
		})
	}
}

// A waiter blocked on the row gets it when the holder commits, and reads the
// holder's committed write: the lock serialised them.
func TestWaiterGetsRowAfterHolderCommits(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	l, err := rowlock.New(rowlock.Options{Table: "orders", Columns: []string{"amount"}, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	holder := begin(t, pool)
	var amount int64
	if _, err := l.Lock(ctx, holder, 1, &amount); err != nil {
		t.Fatal(err)
	}
	var waiterPID uint32
	type result struct {
		amount int64
		waited time.Duration
		err    error
	}
	res := make(chan result, 1)
	waiter := begin(t, pool)
	waiterPID = waiter.Conn().PgConn().PID()
	go func() {
		var a int64
		w, err := l.Lock(ctx, waiter, 1, &a)
		res <- result{a, w, err}
	}()
	// Wait until PostgreSQL shows the waiter blocked on a lock.
	for {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, waiterPID).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := holder.Exec(ctx, "UPDATE orders SET amount = amount + 5 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.amount != 15 {
		t.Errorf("waiter read %d, want the holder's committed 15", r.amount)
	}
	if r.waited <= 0 {
		t.Errorf("waited = %s, want a measured wait", r.waited)
	}
}

func TestMissingRow(t *testing.T) {
	pool := setup(t)
	for _, noWait := range []bool{false, true} {
		l, err := rowlock.New(rowlock.Options{Table: "orders", NoWait: noWait})
		if err != nil {
			t.Fatal(err)
		}
		tx := begin(t, pool)
		if _, err := l.Lock(context.Background(), tx, 99); !errors.Is(err, rowlock.ErrNotFound) {
			t.Errorf("noWait=%v: Lock(missing) = %v, want ErrNotFound", noWait, err)
		}
	}
}

// Example shows the shape of a handler that locks an order row.
func Example() {
	orders, err := rowlock.New(rowlock.Options{Table: "orders", Columns: []string{"status"}, Timeout: time.Second})
	if err != nil {
		panic(err)
	}
	handle := func(ctx context.Context, pool *pgxpool.Pool, orderID int64) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var status string
			if _, err := orders.Lock(ctx, tx, orderID, &status); err != nil {
				return err // busy: sdk.RetryAfter; the Worker redelivers later
			}
			_, err := tx.Exec(ctx, "UPDATE orders SET status = 'paid' WHERE id = $1", orderID)
			return err
		})
	}
	_ = handle
}

// TestTimeoutPostgreSQLCannotSet: lock_timeout holds at most 2^31-1 ms
// (about 24.8 days). New took a longer Timeout (30 days: "wait as long as
// it takes"), and then every Lock failed setting it (SQLSTATE 22023):
// every job was retried to its last attempt and dead-lettered, the row
// never locked. New refuses it; the largest value works.
func TestTimeoutPostgreSQLCannotSet(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	if l, err := rowlock.New(rowlock.Options{Table: "orders", Timeout: 30 * 24 * time.Hour}); err == nil {
		_, err := l.Lock(ctx, begin(t, pool), 1)
		t.Fatalf("New accepted a 30-day Timeout, with which Lock = %v", err)
	}
	largest := time.Duration(1<<31-1) * time.Millisecond
	l, err := rowlock.New(rowlock.Options{Table: "orders", Timeout: largest})
	if err != nil {
		t.Fatalf("New(Timeout %s) = %v, want PostgreSQL's largest lock_timeout accepted", largest, err)
	}
	if _, err := l.Lock(ctx, begin(t, pool), 1); err != nil {
		t.Fatalf("Lock with Timeout %s = %v", largest, err)
	}
	if _, err := rowlock.New(rowlock.Options{Table: "orders", NoWait: true, Timeout: 30 * 24 * time.Hour}); err != nil {
		t.Errorf("New(NoWait, 30-day Timeout) = %v: Timeout is ignored with NoWait", err)
	}
}
