package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestMigrateAgainTakesNoTableLock: Migrate on a schema already migrated
// (every process runs it as it starts, brokerurl's migrate=true) does not
// lock the jobs table. It ran the DDL again, and CREATE INDEX IF NOT EXISTS
// takes its SHARE lock before it finds the index: it waited for every
// transaction that had written to the table (here a PublishTx in an open
// business transaction), and every claim, ack and publish queued behind
// it — the whole broker stalled while a process started. The migrating
// session has a lock_timeout, so the wait shows as an error.
func TestMigrateAgainTakesNoTableLock(t *testing.T) {
	pool := newPool(t, "berth-migratelock-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{})
	ctx := testCtx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if err := b.PublishTx(ctx, tx, "migratelock", &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}

	other := newPoolWith(t, "berth-migratelock-other", 2, map[string]string{"lock_timeout": "500ms"})
	again, err := postgres.New(other, postgres.Options{Schema: b.Schema(), DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Close() })
	mctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := again.Migrate(mctx); err != nil {
		t.Fatalf("Migrate of a migrated schema while a transaction has written to the jobs table: %v", err)
	}
	// A schema not migrated yet is still created.
	fresh, err := postgres.New(other, postgres.Options{Schema: freshSchema(t, pool), DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fresh.Close() })
	if err := fresh.Migrate(mctx); err != nil {
		t.Fatalf("Migrate of a new schema: %v", err)
	}
	if err := fresh.Publish(ctx, "migratelock", &sdk.Message{Body: []byte("y")}); err != nil {
		t.Fatalf("Publish after Migrate: %v", err)
	}
}
