package pgschema_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/pause"
)

// TestMigrateAgainTakesNoTableLock: every part's Migrate on a schema
// already migrated (each process runs it as it starts) takes no lock on
// the tables the application writes. The idempotency store and the ledger
// ran their DDL again, and CREATE INDEX IF NOT EXISTS takes its SHARE lock
// on the table before it finds the index: a process starting waited for
// every transaction that had written to the table (a handler's, in
// transactional mode, holding its key row), and every write queued behind
// it — handlers stalled during a rolling deploy (the outbox's ALTER TABLE
// ... ADD COLUMN IF NOT EXISTS took an ACCESS EXCLUSIVE lock before it
// found the column, stalling every Add). Here a transaction holds
// the lock a write takes (ROW EXCLUSIVE) on each table, and Migrate runs
// on a pool with a lock_timeout, so a wait shows as an error. A missing
// index is still made again.
func TestMigrateAgainTakesNoTableLock(t *testing.T) {
	pool, schema := pgtest.Schema(t, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
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
	defer other.Close()

	type part struct {
		name    string
		migrate func(p *pgxpool.Pool) func(context.Context) error
		table   string // written by the application
		index   string // one of its indexes, dropped to check it is made again
	}
	parts := []part{
		{"broker", func(p *pgxpool.Pool) func(context.Context) error {
			b, err := postgres.New(p, postgres.Options{Schema: schema, DisableListen: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			return b.Migrate
		}, "jobs", ""},
		{"idempotency store", func(p *pgxpool.Pool) func(context.Context) error {
			s, err := pgstore.New(p, pgstore.Options{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			return s.Migrate
		}, pgstore.DefaultTable, pgstore.DefaultTable + "_expires_at_idx"},
		{"ledger", func(p *pgxpool.Pool) func(context.Context) error {
			s, err := pgledger.New(p, pgledger.Options{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			return s.Migrate
		}, pgledger.DefaultPrefix + "jobs", pgledger.DefaultPrefix + "jobs_updated_idx"},
		{"outbox", func(p *pgxpool.Pool) func(context.Context) error {
			o, err := outbox.New(p, outbox.Options{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			return o.Migrate
		}, "berth_outbox", "berth_outbox_unparked_idx"},
		{"pause", func(p *pgxpool.Pool) func(context.Context) error {
			s, err := pause.NewPG(p, pause.PGOptions{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			return s.Migrate
		}, "", ""},
	}
	for _, p := range parts {
		if err := p.migrate(pool)(ctx); err != nil {
			t.Fatalf("%s: first Migrate: %v", p.name, err)
		}
	}
	// The pause table's name is the package's: found in the catalog.
	var pauseTable string
	if err := pool.QueryRow(ctx, `SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname LIKE '%pause%'`, schema).Scan(&pauseTable); err != nil {
		t.Fatalf("the pause table: %v", err)
	}
	parts[len(parts)-1].table = pauseTable

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	for _, p := range parts {
		if _, err := tx.Exec(ctx, `LOCK TABLE `+pgx.Identifier{schema, p.table}.Sanitize()+` IN ROW EXCLUSIVE MODE`); err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
	}
	for _, p := range parts {
		if err := p.migrate(other)(ctx); err != nil {
			t.Errorf("%s: Migrate again while a transaction writes to %s: %v", p.name, p.table, err)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	for _, p := range parts {
		if p.index == "" {
			continue
		}
		pgtest.Exec(t, pool, `DROP INDEX `+pgx.Identifier{schema, p.index}.Sanitize())
		if err := p.migrate(other)(ctx); err != nil {
			t.Fatalf("%s: Migrate without index %s: %v", p.name, p.index, err)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = $2`, schema, p.index).Scan(&n); err != nil || n != 1 {
			t.Errorf("%s: index %s after Migrate: %d, %v; want it made again", p.name, p.index, n, err)
		}
	}
}
