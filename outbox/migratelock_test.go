package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// TestMigrateAgainTakesNoTableLock: Migrate of an outbox already migrated
// (every process runs it as it starts) does not lock the outbox table. It
// ran the DDL again, and ALTER TABLE ... ADD COLUMN IF NOT EXISTS takes its
// ACCESS EXCLUSIVE lock before it finds the column (CREATE INDEX IF NOT
// EXISTS its SHARE lock before it finds the index): it waited for every
// transaction that had added a row (here a business transaction still
// open, as is a relay's during its publish), and every Add of the
// application, and the relay, queued behind it — the producers stalled
// while a process started. The migrating session has a lock_timeout, so
// the wait shows as an error.
func TestMigrateAgainTakesNoTableLock(t *testing.T) {
	ctx := context.Background()
	pool, box, _, schema := setupSchema(t, outbox.Options{})
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if err := box.Add(ctx, tx, "q", &sdk.Message{Type: "t"}); err != nil {
		t.Fatal(err)
	}

	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "500ms"
	other, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	again, err := outbox.New(other, outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := again.Migrate(mctx); err != nil {
		t.Fatalf("Migrate of a migrated outbox while a transaction has added a row: %v", err)
	}

	// A table of an older version (without the columns and indexes added
	// since) is still upgraded, and a new one still created.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DROP INDEX `+pgx.Identifier{schema, "berth_outbox_unparked_idx"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if err := again.Migrate(mctx); err != nil {
		t.Fatalf("Migrate of an outbox without its latest index: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'berth_outbox_unparked_idx'`, schema).Scan(&n); err != nil || n != 1 {
		t.Fatalf("index after Migrate: %d, %v; want it made again", n, err)
	}
	fresh, err := outbox.New(other, outbox.Options{Schema: schema, Table: "fresh_outbox"})
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Migrate(mctx); err != nil {
		t.Fatalf("Migrate of a new outbox: %v", err)
	}
	add(t, pool, fresh, "q", &sdk.Message{Type: "t"})
	if n, err := fresh.Pending(ctx); err != nil || n != 1 {
		t.Fatalf("Pending after Add = %d, %v; want 1", n, err)
	}
}
