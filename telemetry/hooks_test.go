package telemetry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/concurrency/optimistic"
	"github.com/berthq/berth/concurrency/rowlock"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/telemetry"
)

// TestConcurrencyHooksOnPostgres wires the Observer into the concurrency
// packages' own hooks (rowlock.Options.Observe, optimistic.Retrier.OnConflict)
// and makes them fire on a real PostgreSQL: a row lock that waits and one
// refused with NOWAIT, an update that loses its optimistic race once.
func TestConcurrencyHooksOnPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := uniqueQueue(t, "berth_telhooks")
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	table := schema + ".orders"
	if _, err := pool.Exec(ctx, `CREATE TABLE "`+schema+`".orders (id int PRIMARY KEY, status text NOT NULL, version bigint NOT NULL);
		INSERT INTO "`+schema+`".orders VALUES (1, 'pending', 1)`); err != nil {
		t.Fatal(err)
	}
	obs, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{})

	waiting, err := rowlock.New(rowlock.Options{Table: table, Observe: obs.RowLockObserved})
	if err != nil {
		t.Fatal(err)
	}
	noWait, err := rowlock.New(rowlock.Options{Table: table, NoWait: true, Observe: obs.RowLockObserved})
	if err != nil {
		t.Fatal(err)
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := waiting.Lock(ctx, holder, 1); err != nil {
		t.Fatal(err)
	}
	busy, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noWait.Lock(ctx, busy, 1); !errors.Is(err, rowlock.ErrBusy) {
		t.Errorf("NOWAIT on a held row: %v, want ErrBusy", err)
	}
	_ = busy.Rollback(ctx)
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	orders, err := optimistic.New(optimistic.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	retrier := optimistic.Retrier{OnConflict: obs.VersionConflictHook("orders")}
	tries := 0
	err = retrier.Do(ctx, func(ctx context.Context) error {
		tries++
		var status string
		version, err := orders.Get(ctx, pool, 1, []string{"status"}, &status)
		if err != nil {
			return err
		}
		if tries == 1 { // another writer gets there between our read and our write
			if _, err := orders.Update(ctx, pool, 1, version, map[string]any{"status": "processing"}); err != nil {
				return err
			}
		}
		_, err = orders.Update(ctx, pool, 1, version, map[string]any{"status": "paid"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	ms := collect(t, reader)
	res := telemetry.AttrResource.String(table)
	if got := ms.sum("berth.concurrency.lock_wait.duration", res, telemetry.AttrLockAcquired.Bool(true)); got != 1 {
		t.Errorf("acquired row locks recorded %v, want 1", got)
	}
	if got := ms.sum("berth.concurrency.lock_wait.duration", res, telemetry.AttrLockAcquired.Bool(false)); got != 1 {
		t.Errorf("refused row locks recorded %v, want 1", got)
	}
	if got := ms.sum("berth.concurrency.version_conflicts", telemetry.AttrResource.String("orders")); got != 1 {
		t.Errorf("version conflicts recorded %v, want 1", got)
	}
}
