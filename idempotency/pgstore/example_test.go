package pgstore_test

import (
	"context"
	"log"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A transactional charge handler: the order update commits with the
// idempotency key, or neither does. A redelivery after the commit finds the
// key and is acked without charging again.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Options{}) // public.job_results
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.Middleware(idempotency.Options{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	charge := sdk.JSON(func(ctx context.Context, d sdk.Delivery, job struct{ OrderID string }) error {
		tx, _ := pgstore.TxFrom(ctx) // the guard's transaction
		tag, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid', charged_at = now(), version = version + 1
WHERE id = $1 AND charged_at IS NULL`, job.OrderID)
		if err != nil {
			return err // transient: rolled back, retried
		}
		outcome := `{"outcome":"charged"}`
		if tag.RowsAffected() == 0 {
			outcome = `{"outcome":"already_charged"}`
		}
		idempotency.SetResult(ctx, idempotency.Result{ResourceType: "order", ResourceID: job.OrderID, JSON: []byte(outcome)})
		return nil
	})
	// Run it in a Worker: sdk.WorkerOptions{Queue: "billing", Middleware: []sdk.Middleware{guard}}.
	_ = guard(charge)
}
