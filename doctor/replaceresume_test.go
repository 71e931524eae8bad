package doctor_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/ledger/pgledger"
)

// indexNamed is postgres.Indexes' index of that name.
func indexNamed(t *testing.T, name string) postgres.Index {
	t.Helper()
	for _, ix := range postgres.Indexes() {
		if ix.Name == name {
			return ix
		}
	}
	t.Fatalf("no index %s", name)
	return postgres.Index{}
}

// pgIndexFinding runs doctor and returns its one postgres.indexes finding.
func pgIndexFinding(t *testing.T, pool *pgxpool.Pool, schema string) doctor.Finding {
	t.Helper()
	fs, err := doctor.Postgres(testCtx(t), pool, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := find(fs, "postgres.indexes", schema+".jobs")
	if len(f) != 1 {
		t.Fatalf("postgres.indexes: %+v", f)
	}
	return f[0]
}

// TestPostgresIndexReplaceFailedUnique: the replacement of a dedupe index
// defined otherwise (not unique) fails where rows share its key, and
// leaves an invalid jobs_dedupe_idx_new. The next run says so, and why,
// rather than giving the same statements as if nothing had been tried;
// once the rows are settled the statements end OK.
func TestPostgresIndexReplaceFailedUnique(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()
	ix := indexNamed(t, "jobs_dedupe_idx")
	for _, stmt := range []string{
		`DROP INDEX ` + pgx.Identifier{schema, ix.Name}.Sanitize(),
		`CREATE INDEX jobs_dedupe_idx ON ` + qt + ` (queue, idempotency_key) WHERE dedupe`,
		`INSERT INTO ` + qt + ` (queue, message_id, payload, max_attempts, idempotency_key, dedupe)
			VALUES ('q', 'm1', '\x00', 1, 'k', true), ('q', 'm2', '\x00', 1, 'k', true)`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if f := pgIndexFinding(t, pool, schema); f.Severity != doctor.Error || !strings.Contains(f.Evidence, ix.Name+" defined as") {
		t.Fatalf("postgres.indexes: %+v; want the dedupe index defined otherwise, an error", f)
	}
	replace := ix.Replace(schema)
	if _, err := pool.Exec(ctx, replace[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, replace[1]); err == nil {
		t.Fatalf("%s: built over rows that share its key", replace[1])
	}
	f := pgIndexFinding(t, pool, schema)
	if f.Severity != doctor.Error || !strings.Contains(f.Evidence, ix.Name+"_new is invalid: its build failed") ||
		!strings.Contains(f.Evidence, "rows that share its key") || !strings.Contains(f.Fix, strings.Join(replace, "; ")) {
		t.Fatalf("postgres.indexes: %+v; want the failed replacement, why, and the statements again", f)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+qt+` WHERE message_id = 'm2'`); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range replace {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if f := pgIndexFinding(t, pool, schema); f.Severity != doctor.OK {
		t.Fatalf("postgres.indexes: %+v; want OK", f)
	}
}

// TestPostgresIndexReplaceResumes: a replacement whose build is under way
// is Info with nothing to run (Replace's first statement would drop the
// build); one built and not yet swapped in gets the statements left, not
// a second build; and one whose old index is dropped but which is not yet
// renamed gets the rename, not a CREATE of another.
func TestPostgresIndexReplaceResumes(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()
	ix := indexNamed(t, "jobs_claim_idx")
	for _, stmt := range []string{
		`DROP INDEX ` + pgx.Identifier{schema, ix.Name}.Sanitize(),
		`CREATE INDEX jobs_claim_idx ON ` + qt + ` (queue, available_at) WHERE status IN ('queued', 'retry')`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	replace := ix.Replace(schema)
	if _, err := pool.Exec(ctx, replace[0]); err != nil {
		t.Fatal(err)
	}
	finish := buildHeld(t, pool, `INSERT INTO `+qt+` (queue, message_id, payload, max_attempts) VALUES ('q', 'm', '\x00', 1)`,
		replace[1], pgx.Identifier{schema, ix.Name + "_new"}.Sanitize())
	f := pgIndexFinding(t, pool, schema)
	if f.Severity != doctor.Info || !strings.Contains(f.Evidence, ix.Name+"_new is being built") || strings.Contains(f.Fix, "DROP INDEX") {
		t.Errorf("postgres.indexes: %+v; want the replacement being built, Info, and no DROP", f)
	}
	finish()
	f = pgIndexFinding(t, pool, schema)
	left := strings.Join(replace[2:], "; ")
	if !strings.Contains(f.Evidence, ix.Name+"_new is built") || !strings.Contains(f.Fix, "run "+left+" (") || strings.Contains(f.Fix, "CREATE INDEX CONCURRENTLY IF NOT EXISTS") {
		t.Fatalf("postgres.indexes: %+v; want the replacement built, and only %s", f, left)
	}
	if _, err := pool.Exec(ctx, replace[2]); err != nil {
		t.Fatal(err)
	}
	f = pgIndexFinding(t, pool, schema)
	if !strings.Contains(f.Evidence, ix.Name+" missing, its replacement "+ix.Name+"_new built but not renamed") ||
		!strings.Contains(f.Fix, "run "+replace[3]+" (") || strings.Contains(f.Fix, "CREATE INDEX CONCURRENTLY IF NOT EXISTS") {
		t.Fatalf("postgres.indexes: %+v; want only %s", f, replace[3])
	}
	if _, err := pool.Exec(ctx, replace[3]); err != nil {
		t.Fatal(err)
	}
	if f := pgIndexFinding(t, pool, schema); f.Severity != doctor.OK {
		t.Fatalf("postgres.indexes: %+v; want OK", f)
	}
}

// ledgerIndexFinding runs doctor on store and returns its one
// ledger.indexes finding.
func ledgerIndexFinding(t *testing.T, store *pgledger.Store, table string) doctor.Finding {
	t.Helper()
	fs, err := doctor.Ledger(testCtx(t), store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := find(fs, "ledger.indexes", table)
	if len(f) != 1 {
		t.Fatalf("ledger.indexes: %+v", f)
	}
	return f[0]
}

// TestLedgerIndexReplaceResumes: as TestPostgresIndexReplaceResumes, for
// the ledger. Before, doctor did not look at the _new index: while its
// build ran it gave the whole Replace again, whose first DROP throws the
// build away; once built it gave the whole Replace again (a second build);
// after the drop it gave a CREATE of the name, leaving the _new index
// beside it; and it never mentioned a failed one.
func TestLedgerIndexReplaceResumes(t *testing.T) {
	_, pool, schema := pgURL(t, nil)
	ctx := testCtx(t)
	store := migratedLedger(t, pool, schema)
	table := schema + ".ledger_jobs"
	const name = "ledger_jobs_queue_status_idx"
	oldLedgerIndex(t, pool, store, schema)
	replace := ledgerReplace(t, store, name)
	newIdx := pgx.Identifier{schema, name + "_new"}.Sanitize()
	// A build that failed: an invalid _new index, left by an interrupt.
	for _, stmt := range []string{replace[0],
		`CREATE INDEX ` + name + `_new ON ` + store.Table() + ` (queue, status, updated_at, message_id)`,
		`UPDATE pg_index SET indisvalid = false WHERE indexrelid = '` + newIdx + `'::regclass`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	f := ledgerIndexFinding(t, store, table)
	if f.Severity != doctor.Warn || !strings.Contains(f.Evidence, name+"_new is invalid: its build failed") ||
		!strings.Contains(f.Fix, "run "+strings.Join(replace, "; ")+" (") {
		t.Fatalf("ledger.indexes: %+v; want the failed replacement, and the statements again", f)
	}
	if _, err := pool.Exec(ctx, replace[0]); err != nil {
		t.Fatal(err)
	}
	finish := buildHeld(t, pool, `INSERT INTO `+store.Table()+` (message_id, status, rank, first_seen_at, updated_at) VALUES ('m', 'enqueued', 0, now(), now())`,
		replace[1], newIdx)
	f = ledgerIndexFinding(t, store, table)
	if f.Severity != doctor.Info || !strings.Contains(f.Evidence, name+"_new is being built") || strings.Contains(f.Fix, "DROP INDEX") {
		t.Errorf("ledger.indexes: %+v; want the replacement being built, Info, and no DROP", f)
	}
	finish()
	f = ledgerIndexFinding(t, store, table)
	left := strings.Join(replace[2:], "; ")
	if !strings.Contains(f.Evidence, name+"_new is built") || !strings.Contains(f.Fix, "run "+left+" (") || strings.Contains(f.Fix, "CREATE INDEX CONCURRENTLY IF NOT EXISTS") {
		t.Fatalf("ledger.indexes: %+v; want the replacement built, and only %s", f, left)
	}
	if _, err := pool.Exec(ctx, replace[2]); err != nil {
		t.Fatal(err)
	}
	f = ledgerIndexFinding(t, store, table)
	if !strings.Contains(f.Evidence, name+" missing, its replacement "+name+"_new built but not renamed") ||
		!strings.Contains(f.Fix, "run "+replace[3]+" (") || strings.Contains(f.Fix, "CREATE INDEX CONCURRENTLY IF NOT EXISTS") {
		t.Fatalf("ledger.indexes: %+v; want only %s", f, replace[3])
	}
	if _, err := pool.Exec(ctx, replace[3]); err != nil {
		t.Fatal(err)
	}
	if f := ledgerIndexFinding(t, store, table); f.Severity != doctor.OK {
		t.Fatalf("ledger.indexes: %+v; want OK", f)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_index WHERE indrelid = $1::regclass`, store.Table()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	ixs, err := store.Indexes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(ixs) + 1; n != want { // and the primary key
		t.Fatalf("%d indexes on %s, want %d: none left over", n, store.Table(), want)
	}
}

// printedStatements returns the statements a postgres.indexes or
// ledger.indexes fix prints, as printed, in order.
func printedStatements(t *testing.T, fix string) []string {
	t.Helper()
	body, ok := strings.CutPrefix(fix, "run ")
	if !ok {
		t.Fatalf("fix %q: nothing to run", fix)
	}
	body, _, ok = strings.Cut(body, " (each on its own")
	if !ok {
		t.Fatalf("fix %q: no end to its statements", fix)
	}
	var out []string
	for _, s := range strings.Split(body, "; ") {
		if r, ok := strings.CutPrefix(s, "rename that relation ("); ok {
			s = strings.TrimSuffix(r, " for an index)")
		}
		out = append(out, s)
	}
	return out
}

// TestIndexReplaceNewNameHeldElsewhere: an index defined otherwise whose
// replacement's name (<name>_new) an archived table's index holds, as one
// a Replace stopped halfway left on the table before it was renamed away.
// Replace's first statement, DROP INDEX ... <name>_new, dropped that
// archive's index; doctor now renames it first, and the statements it
// prints, run as printed, end OK with the archive's index kept.
func TestIndexReplaceNewNameHeldElsewhere(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	store := migratedLedger(t, pool, schema)
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()
	archive := pgx.Identifier{schema, "archive"}.Sanitize()
	for _, stmt := range []string{
		`CREATE TABLE ` + archive + ` (queue text, status text, available_at timestamptz, updated_at timestamptz, message_id text)`,
		`CREATE INDEX jobs_claim_idx_new ON ` + archive + ` (queue, available_at)`,
		`CREATE INDEX ledger_jobs_queue_status_idx_new ON ` + archive + ` (queue, status, updated_at, message_id)`,
		`DROP INDEX ` + pgx.Identifier{schema, "jobs_claim_idx"}.Sanitize(),
		`CREATE INDEX jobs_claim_idx ON ` + qt + ` (queue, available_at) WHERE status IN ('queued', 'retry')`,
		`DROP INDEX ` + pgx.Identifier{schema, "ledger_jobs_queue_status_idx"}.Sanitize(),
		`CREATE INDEX ledger_jobs_queue_status_idx ON ` + store.Table() + ` (queue, status)`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	archived := func(after string) {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_index WHERE indrelid = $1::regclass`, archive).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Fatalf("after %s: the archive has %d indexes, want its 2", after, n)
		}
	}
	for _, side := range []struct {
		id, table string
		finding   func() doctor.Finding
	}{
		{"postgres.indexes", schema + ".jobs", func() doctor.Finding { return pgIndexFinding(t, pool, schema) }},
		{"ledger.indexes", schema + ".ledger_jobs", func() doctor.Finding { return ledgerIndexFinding(t, store, schema+".ledger_jobs") }},
	} {
		f := side.finding()
		if !strings.Contains(f.Evidence, "_new, is held in the schema by an index of archive") {
			t.Fatalf("%s: %+v; want the replacement's name held by the archive's index", side.id, f)
		}
		for _, stmt := range printedStatements(t, f.Fix) {
			if _, err := pool.Exec(ctx, stmt); err != nil {
				t.Fatalf("%s: %s: %v", side.id, stmt, err)
			}
			archived(stmt)
		}
		if f := side.finding(); f.Severity != doctor.OK {
			t.Fatalf("%s: %+v; want OK", side.id, f)
		}
	}
}
