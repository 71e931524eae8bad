package postgres_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// SchemaSQL renders the DDL for a schema of your choice, for teams who apply
// migrations with their own tool.
func ExampleSchemaSQL() {
	ddl, err := postgres.SchemaSQL("billing_jobs")
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(ddl, "\n") {
		if strings.HasPrefix(line, "CREATE") {
			fmt.Println(strings.TrimSuffix(line, " ("))
		}
	}
	// Output:
	// CREATE SCHEMA IF NOT EXISTS "billing_jobs";
	// CREATE TABLE IF NOT EXISTS "billing_jobs".jobs
	// CREATE TABLE IF NOT EXISTS "billing_jobs".queues
	// CREATE INDEX IF NOT EXISTS jobs_claim_idx ON "billing_jobs".jobs (queue, available_at)
	// CREATE UNIQUE INDEX IF NOT EXISTS jobs_dedupe_idx ON "billing_jobs".jobs (queue, idempotency_key)
	// CREATE INDEX IF NOT EXISTS jobs_dead_letter_idx ON "billing_jobs".jobs (queue, message_id)
	// CREATE INDEX IF NOT EXISTS jobs_completed_idx ON "billing_jobs".jobs (updated_at)
	// CREATE INDEX IF NOT EXISTS jobs_dead_letter_page_idx ON "billing_jobs".jobs (queue, updated_at, id)
}

// The broker on your database: migrate once, enqueue a job in the same
// transaction as the order it charges, and run a Worker on the queue.
func ExampleBroker_PublishTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	broker, err := postgres.New(pool, postgres.Options{Schema: "jobs", Lease: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	if err := broker.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// The job exists if and only if the order does.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, status) VALUES ('order_123', 'pending')`); err != nil {
			return err
		}
		return broker.PublishTx(ctx, tx, "billing", &sdk.Message{
			Type:           "billing.charge",
			IdempotencyKey: "charge:order_123:v1",
			Body:           []byte(`{"order_id":"order_123"}`),
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	w, err := sdk.NewWorker(broker, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		return nil // charge the order
	}), sdk.WorkerOptions{Queue: "billing", Lease: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
