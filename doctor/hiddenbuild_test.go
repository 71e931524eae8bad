package doctor_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/ledger/pgledger"
)

// readerPool returns a pool of a role of its own that may read schema's
// tables, without pg_read_all_stats, as doctor's monitoring user: it sees
// another role's build in pg_stat_progress_create_index without its index.
// The role is dropped when the test ends.
func readerPool(t *testing.T, pool *pgxpool.Pool, schema string) *pgxpool.Pool {
	t.Helper()
	ctx := testCtx(t)
	role := schema + "_reader"
	qr, qs := pgx.Identifier{role}.Sanitize(), pgx.Identifier{schema}.Sanitize()
	for _, stmt := range []string{
		`CREATE ROLE ` + qr + ` LOGIN`,
		`GRANT USAGE ON SCHEMA ` + qs + ` TO ` + qr,
		`GRANT SELECT ON ALL TABLES IN SCHEMA ` + qs + ` TO ` + qr,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	u, err := url.Parse(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	reader, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		reader.Close()
		_, _ = pool.Exec(context.Background(), `DROP OWNED BY `+qr)
		_, _ = pool.Exec(context.Background(), `DROP ROLE `+qr)
	})
	return reader
}

// TestIndexBuildOfAnotherRole: doctor's user, without pg_read_all_stats,
// sees another role's CREATE INDEX CONCURRENTLY in
// pg_stat_progress_create_index without its index. An invalid index (or
// replacement) may be that build's: doctor says so and prints no DROP,
// which would throw the build away. Before, it read the build as a failed
// one and printed the DROP.
func TestIndexBuildOfAnotherRole(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	store := migratedLedger(t, pool, schema)
	reader := readerPool(t, pool, schema)
	rstore, err := pgledger.New(reader, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()

	// The broker's: an index built by its owner.
	ix := indexNamed(t, "jobs_dead_letter_page_idx")
	if _, err := pool.Exec(ctx, ix.Drop(schema)); err != nil {
		t.Fatal(err)
	}
	finish := buildHeld(t, pool, `INSERT INTO `+qt+` (queue, message_id, payload, max_attempts) VALUES ('q', 'm', '\x00', 1)`,
		ix.Create(schema), pgx.Identifier{schema, ix.Name}.Sanitize())
	f := pgIndexFinding(t, reader, schema)
	if !strings.Contains(f.Evidence, ix.Name+" invalid") || !strings.Contains(f.Evidence, "without saying of which index") || strings.Contains(f.Fix, "DROP INDEX") {
		t.Errorf("postgres.indexes as a reader: %+v; want %s invalid, maybe the build under way, and no DROP", f, ix.Name)
	}
	finish()
	if f := pgIndexFinding(t, reader, schema); f.Severity != doctor.OK {
		t.Fatalf("postgres.indexes as a reader: %+v; want OK", f)
	}

	// The ledger's: a replacement built by its owner.
	const name = "ledger_jobs_queue_status_idx"
	table := schema + ".ledger_jobs"
	oldLedgerIndex(t, pool, store, schema)
	replace := ledgerReplace(t, store, name)
	finish = buildHeld(t, pool, `INSERT INTO `+store.Table()+` (message_id, status, rank, first_seen_at, updated_at) VALUES ('m', 'enqueued', 0, now(), now())`,
		replace[1], pgx.Identifier{schema, name + "_new"}.Sanitize())
	f = ledgerIndexFinding(t, rstore, table)
	if !strings.Contains(f.Evidence, name+"_new is invalid") || !strings.Contains(f.Evidence, "without saying of which index") || strings.Contains(f.Fix, "DROP INDEX") {
		t.Errorf("ledger.indexes as a reader: %+v; want %s_new invalid, maybe the build under way, and no DROP", f, name)
	}
	finish()
	f = ledgerIndexFinding(t, rstore, table)
	for _, stmt := range printedStatements(t, f.Fix) {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if f := ledgerIndexFinding(t, rstore, table); f.Severity != doctor.OK {
		t.Fatalf("ledger.indexes as a reader: %+v; want OK", f)
	}
}

// TestLedgerHiddenBuildNamesTheRole: with nothing to run but an index
// that another role's build may be building (doctor's user sees the build
// without its index), the ledger's fix says, as the broker's does, which
// role would see whose build it is. Before, it said only to let the build
// finish, though doctor cannot tell that the index is being built.
func TestLedgerHiddenBuildNamesTheRole(t *testing.T) {
	_, pool, schema := pgURL(t, nil)
	store := migratedLedger(t, pool, schema)
	reader := readerPool(t, pool, schema)
	rstore, err := pgledger.New(reader, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	const name = "ledger_jobs_first_seen_idx"
	create := ledgerIndexNamed(t, store, name).Create(true)
	execAll(t, pool, `DROP INDEX `+pgx.Identifier{schema, name}.Sanitize())
	finish := buildHeld(t, pool, `INSERT INTO `+store.Table()+` (message_id, status, rank, first_seen_at, updated_at) VALUES ('m', 'enqueued', 0, now(), now())`,
		create, pgx.Identifier{schema, name}.Sanitize())
	f := ledgerIndexFinding(t, rstore, schema+".ledger_jobs")
	if !strings.Contains(f.Evidence, "without saying of which index") || strings.HasPrefix(f.Fix, "run ") ||
		!strings.Contains(f.Fix, "as a role with pg_read_all_stats, or the build's own, doctor sees which index a build is of") {
		t.Errorf("ledger.indexes as a reader: %+v; want the build maybe under way, nothing to run, and the role that would see it", f)
	}
	finish()
}

// ledgerIndexNamed is store's index of that name, as Indexes reads it.
func ledgerIndexNamed(t *testing.T, store *pgledger.Store, name string) pgledger.Index {
	t.Helper()
	ixs, err := store.Indexes(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, ix := range ixs {
		if ix.Name == name {
			return ix
		}
	}
	t.Fatalf("no ledger index %s", name)
	return pgledger.Index{}
}
