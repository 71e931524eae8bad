package doctor_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/ledger/pgledger"
)

// TestLedgerIndexBuildUnderWay: a ledger index a CREATE INDEX
// CONCURRENTLY is still building (as RUNBOOK has operators build
// ledger_jobs_first_seen_idx on a large table) is reported as being
// built, an Info finding with nothing to run. Before, it was "invalid,
// never read", a Warn whose fix dropped it.
func TestLedgerIndexBuildUnderWay(t *testing.T) {
	_, pool, schema := pgURL(t, nil)
	ctx := testCtx(t)
	store := migratedLedger(t, pool, schema)
	table := schema + ".ledger_jobs"
	const name = "ledger_jobs_first_seen_idx"
	if _, err := pool.Exec(ctx, `DROP INDEX `+pgx.Identifier{schema, name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	ixs, err := store.Indexes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var create string
	for _, ix := range ixs {
		if ix.Name == name {
			create = ix.Create(true)
		}
	}
	finish := buildHeld(t, pool, `INSERT INTO `+store.Table()+` (message_id, status, rank, first_seen_at, updated_at) VALUES ('m', 'enqueued', 0, now(), now())`,
		create, pgx.Identifier{schema, name}.Sanitize())
	fs, err := doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.Info)
	if f := find(fs, "ledger.indexes", table); len(f) != 1 || !strings.Contains(f[0].Evidence, name+" being built") ||
		strings.Contains(f[0].Fix, "DROP INDEX") {
		t.Errorf("ledger.indexes: %+v; want the build under way, and no DROP", f)
	}
	finish()
	fs, err = doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.OK)
}

// TestLedgerIndexNameHeldElsewhere: a ledger table renamed away takes its
// indexes' names along, and Migrate's new table gets none of them
// (CREATE INDEX IF NOT EXISTS skips a name the schema holds). doctor says
// so, and its fix renames the holder first. Before, it reported them
// missing with a fix that skipped them again.
func TestLedgerIndexNameHeldElsewhere(t *testing.T) {
	_, pool, schema := pgURL(t, nil)
	ctx := testCtx(t)
	store := migratedLedger(t, pool, schema)
	table := schema + ".ledger_jobs"
	if _, err := pool.Exec(ctx, `ALTER TABLE `+store.Table()+` RENAME TO ledger_jobs_2025`); err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.Warn)
	f := find(fs, "ledger.indexes", table)
	if len(f) != 1 {
		t.Fatalf("ledger.indexes: %+v", f)
	}
	ixs, err := store.Indexes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ix := range ixs {
		if !strings.Contains(f[0].Evidence, ix.Name+" missing, its name held in the schema by an index of ledger_jobs_2025") {
			t.Errorf("evidence lacks %s held by ledger_jobs_2025: %s", ix.Name, f[0].Evidence)
		}
		rename := `ALTER INDEX ` + pgx.Identifier{schema, ix.Name}.Sanitize() + ` RENAME TO ` + pgx.Identifier{ix.Name + "_old"}.Sanitize()
		if !strings.Contains(f[0].Fix, rename) {
			t.Errorf("fix lacks %s: %s", rename, f[0].Fix)
		}
		for _, stmt := range []string{rename, ix.Create(true)} {
			if _, err := pool.Exec(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
	}
	fs, err = doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.OK)
}

// TestLedgerIndexReplaceKeepsOldServing: the fix for a ledger index
// defined otherwise builds the new one under another name before it drops
// the old one, so that the table always has one while the build runs.
// Before, the fix dropped the old index first.
func TestLedgerIndexReplaceKeepsOldServing(t *testing.T) {
	_, pool, schema := pgURL(t, nil)
	ctx := testCtx(t)
	store := migratedLedger(t, pool, schema)
	table := schema + ".ledger_jobs"
	name := pgx.Identifier{schema, "ledger_jobs_queue_status_idx"}.Sanitize()
	tmp := pgx.Identifier{schema, "ledger_jobs_queue_status_idx_new"}.Sanitize()
	oldLedgerIndex(t, pool, store, schema)
	fs, err := doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.Warn)
	f := find(fs, "ledger.indexes", table)
	if len(f) != 1 {
		t.Fatalf("ledger.indexes: %+v", f)
	}
	stmts := []string{
		`DROP INDEX CONCURRENTLY IF EXISTS ` + tmp,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "ledger_jobs_queue_status_idx_new" ON ` + store.Table() + ` (queue, status, updated_at, message_id)`,
		`DROP INDEX CONCURRENTLY IF EXISTS ` + name,
		`ALTER INDEX ` + tmp + ` RENAME TO "ledger_jobs_queue_status_idx"`,
	}
	if !strings.Contains(f[0].Fix, "run "+strings.Join(stmts, "; ")+" (") {
		t.Fatalf("fix: %s\nwant: run %s", f[0].Fix, strings.Join(stmts, "; "))
	}
	execKeepingValid(t, pool, stmts, name, tmp, "queue-status")
	fs, err = doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.OK)
}

// migratedLedger is a pgledger store on schema with its tables and indexes
// made, as the index checks' tests start from.
func migratedLedger(t *testing.T, pool *pgxpool.Pool, schema string) *pgledger.Store {
	t.Helper()
	store, err := pgledger.New(pool, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return store
}
