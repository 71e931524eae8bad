package concurrency_test

import (
	"context"
	"time"

	"github.com/berthq/berth/concurrency/rowlock"
	"github.com/berthq/berth/concurrency/state"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The billing flow of ARCHITECTURE.md, in one transaction: record the
// idempotency key, lock the order, move it pending → paid through the
// transition table, commit. A duplicate delivery finds the key; a stale
// worker cannot move the order back; a busy order is retried later without
// consuming an attempt.
func Example() {
	var pool *pgxpool.Pool // the application's pool
	orders, err := rowlock.New(rowlock.Options{Table: "orders", Columns: []string{"status"}, Timeout: time.Second})
	if err != nil {
		panic(err)
	}
	flow, err := state.New(state.Options{Table: "orders", Transitions: map[string][]string{
		"pending": {"paid", "cancelled"}, "paid": {"refunded"}, "refunded": nil, "cancelled": nil,
	}})
	if err != nil {
		panic(err)
	}
	charge := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		m := d.Message()
		orderID := m.Header("order_id")
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO job_results (idempotency_key, job_type) VALUES ($1, $2)
				ON CONFLICT (idempotency_key) DO NOTHING`, m.IdempotencyKey, m.Type)
			if err != nil || tag.RowsAffected() == 0 {
				return err // done before: ack
			}
			var status string
			if _, err := orders.Lock(ctx, tx, orderID, &status); err != nil {
				return err // missing: sdk.Permanent (rowlock.ErrNotFound); busy: sdk.RetryAfter
			}
			// ... call the payment provider with m.IdempotencyKey ...
			_, err = flow.Transition(ctx, tx, orderID, "paid", map[string]any{"charged_at": time.Now()})
			return err // a backward move is sdk.Permanent
		})
	})
	_ = charge // run it in an sdk.Worker
}
