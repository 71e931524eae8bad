package telemetry_test

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// Publishing in the business transaction, traced and counted like Publish:
// through the outbox (any broker) or a PostgreSQL broker, both
// sdk.TxPublisher[pgx.Tx]. The type argument is spelled out because Go
// does not infer it from the methods of *outbox.Outbox.
func ExampleWrapTx() {
	ctx := context.Background()
	var pool *pgxpool.Pool // the business database
	var tel *telemetry.Observer
	box, _ := outbox.New(pool, outbox.Options{})
	pub := telemetry.WrapTx[pgx.Tx](tel, box)

	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, "o1"); err != nil {
			return err
		}
		// Published if and only if tx commits; the relay carries the trace on.
		return pub.PublishTx(ctx, tx, "emails", &sdk.Message{Type: "email.receipt", IdempotencyKey: "receipt:o1"})
	})
}
