package optimistic_test

import (
	"context"
	"errors"
	"time"

	"github.com/berthq/berth/concurrency/optimistic"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A read-modify-write of one order, safe against a worker racing on the
// same order: each attempt reloads the row and writes with the version it
// read. A lost race — a stale version, or a serialization failure or
// deadlock of a statement run on the pool as its own transaction — is a
// conflict, and the Retrier tries again, a few milliseconds apart with
// jitter. A missing order is permanent (sdk.Permanent); conflicts on every
// attempt leave a transient error: the job is retried later.
func ExampleTable_Update() {
	var pool *pgxpool.Pool // the application's pool
	orders, err := optimistic.New(optimistic.Options{Table: "orders"})
	if err != nil {
		panic(err)
	}
	retrier := &optimistic.Retrier{MaxAttempts: 10, Backoff: 2 * time.Millisecond}
	addItem := func(ctx context.Context, orderID int64, price int64) error {
		return retrier.Do(ctx, func(ctx context.Context) error {
			var total int64
			version, err := orders.Get(ctx, pool, orderID, []string{"total"}, &total)
			if err != nil {
				return err // optimistic.ErrNotFound is permanent
			}
			_, err = orders.Update(ctx, pool, orderID, version, map[string]any{"total": total + price})
			return err // a *optimistic.ConflictError makes Do reload and retry
		})
	}
	if err := addItem(context.Background(), 1, 250); errors.Is(err, optimistic.ErrVersionConflict) {
		_ = err // every attempt conflicted (*optimistic.ExhaustedError): return it, the job is retried
	}
}
