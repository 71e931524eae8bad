package doctor_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/ledger/pgledger"
)

// leftoverSide is one of the two index checks, on a schema migrated for
// both: the broker's jobs_claim_idx and the ledger's queue/status index.
type leftoverSide struct {
	id      string
	name    string   // the index
	table   string   // its table, quoted
	replace []string // its Replace statements
	insert  string   // a row for buildHeld
	finding func(pool *pgxpool.Pool) doctor.Finding
}

// leftoverSides migrates the broker and the ledger into a schema of their
// own and returns the two sides.
func leftoverSides(t *testing.T) (*pgxpool.Pool, string, []leftoverSide) {
	t.Helper()
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	store := migratedLedger(t, pool, schema)
	const lname = "ledger_jobs_queue_status_idx"
	lreplace := ledgerReplace(t, store, lname)
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()
	return pool, schema, []leftoverSide{
		{"postgres.indexes", "jobs_claim_idx", qt, indexNamed(t, "jobs_claim_idx").Replace(schema),
			`INSERT INTO ` + qt + ` (queue, message_id, payload, max_attempts) VALUES ('q', 'm', '\x00', 1)`,
			func(p *pgxpool.Pool) doctor.Finding { return pgIndexFinding(t, p, schema) }},
		{"ledger.indexes", lname, store.Table(), lreplace,
			`INSERT INTO ` + store.Table() + ` (message_id, status, rank, first_seen_at, updated_at) VALUES ('m', 'enqueued', 0, now(), now())`,
			func(p *pgxpool.Pool) doctor.Finding {
				s, err := pgledger.New(p, pgledger.Options{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				return ledgerIndexFinding(t, s, schema+".ledger_jobs")
			}},
	}
}

// oldLedgerIndex makes the ledger's ledger_jobs_queue_status_idx in schema
// what an earlier release created: (queue, status), a Warn "defined
// otherwise" whose fix is Replace.
func oldLedgerIndex(t *testing.T, pool *pgxpool.Pool, store *pgledger.Store, schema string) {
	t.Helper()
	const name = "ledger_jobs_queue_status_idx"
	execAll(t, pool, `DROP INDEX `+pgx.Identifier{schema, name}.Sanitize(),
		`CREATE INDEX `+name+` ON `+store.Table()+` (queue, status)`)
}

// ledgerReplace is the Replace statements of the ledger's index name, as
// store.Indexes gives them (four: drop a leftover _new, build it, drop the
// old one, rename).
func ledgerReplace(t *testing.T, store *pgledger.Store, name string) []string {
	t.Helper()
	ixs, err := store.Indexes(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, ix := range ixs {
		if ix.Name == name {
			if r := ix.Replace(); len(r) == 4 {
				return r
			}
			t.Fatalf("%s: Replace %q", name, ix.Replace())
		}
	}
	t.Fatalf("%s: not among the ledger's indexes", name)
	return nil
}

// execAll runs stmts on pool, in order.
func execAll(t *testing.T, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, stmt := range stmts {
		if _, err := pool.Exec(testCtx(t), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

// relations counts the relations of schema named name.
func relations(t *testing.T, pool *pgxpool.Pool, schema, name string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace AND relname = $2`,
		pgx.Identifier{schema}.Sanitize(), name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestIndexMissingWithReplacementLeftOver: an index missing while Replace
// left its <name>_new behind. Being built, it is Info with nothing to run
// (the rename follows once built); invalid, left by a build that failed,
// doctor says so and drops it before it creates the index: it is never
// read but kept up to date on every write. Before, doctor printed the
// CREATE alone (a second index beside a build under way) and never
// mentioned the invalid _new, which stayed after a finding of OK.
func TestIndexMissingWithReplacementLeftOver(t *testing.T) {
	pool, schema, sides := leftoverSides(t)
	for _, side := range sides {
		newIdx := pgx.Identifier{schema, side.name + "_new"}.Sanitize()
		// Replace stopped after its drop of the old index, its build
		// under way.
		execAll(t, pool, `DROP INDEX `+pgx.Identifier{schema, side.name}.Sanitize())
		finish := buildHeld(t, pool, side.insert, side.replace[1], newIdx)
		f := side.finding(pool)
		if f.Severity != doctor.Info || !strings.Contains(f.Evidence, side.name+"_new being built") || strings.HasPrefix(f.Fix, "run ") {
			t.Errorf("%s: %+v; want the replacement being built, Info, nothing to run", side.id, f)
		}
		finish()
		for _, stmt := range printedStatements(t, side.finding(pool).Fix) {
			execAll(t, pool, stmt)
		}
		if f := side.finding(pool); f.Severity != doctor.OK {
			t.Fatalf("%s: %+v; want OK", side.id, f)
		}

		// The index missing, an invalid _new left by a build that failed.
		execAll(t, pool, `DROP INDEX `+pgx.Identifier{schema, side.name}.Sanitize(), side.replace[1],
			`UPDATE pg_index SET indisvalid = false WHERE indexrelid = '`+newIdx+`'::regclass`)
		f = side.finding(pool)
		if !strings.Contains(f.Evidence, side.name+"_new is invalid") {
			t.Errorf("%s: %+v; want the invalid replacement named", side.id, f)
		}
		for _, stmt := range printedStatements(t, f.Fix) {
			execAll(t, pool, stmt)
		}
		if f := side.finding(pool); f.Severity != doctor.OK {
			t.Fatalf("%s: %+v; want OK", side.id, f)
		}
		if n := relations(t, pool, schema, side.name+"_new"); n != 0 {
			t.Errorf("%s: %s_new left after the fix", side.id, side.name)
		}
	}
}

// TestIndexReplacementBuildUnread: where doctor's user cannot read
// pg_stat_progress_create_index, an invalid <name>_new may be a build
// under way: the evidence says so, as it does for an invalid <name>, and
// the fix warns before its DROP. Before, it said flatly "its build failed"
// and printed Replace, whose first statement throws that build away.
func TestIndexReplacementBuildUnread(t *testing.T) {
	pool, schema, sides := leftoverSides(t)
	refused := progressRefused(t, pool, schema)
	for _, side := range sides {
		newIdx := pgx.Identifier{schema, side.name + "_new"}.Sanitize()
		execAll(t, pool, `DROP INDEX `+pgx.Identifier{schema, side.name}.Sanitize(),
			`CREATE INDEX `+pgx.Identifier{side.name}.Sanitize()+` ON `+side.table+` (queue)`)
		finish := buildHeld(t, pool, side.insert, side.replace[1], newIdx)
		f := side.finding(refused)
		if !strings.Contains(f.Evidence, side.name+"_new is invalid: its build failed, or one under way builds it") ||
			!strings.Contains(f.Fix, "cannot read pg_stat_progress_create_index") {
			t.Errorf("%s: %+v; want the invalid replacement maybe under way, and a warning before the DROP", side.id, f)
		}
		finish()
		for _, stmt := range printedStatements(t, side.finding(refused).Fix) {
			execAll(t, pool, stmt)
		}
		if f := side.finding(refused); f.Severity != doctor.OK {
			t.Fatalf("%s: %+v; want OK", side.id, f)
		}
	}
}

// TestIndexReplaceKeepsHandMadeNew: an index defined otherwise beside a
// valid <name>_new that is not its replacement (made by hand, with other
// columns) and may serve queries. Doctor renames that one away before
// Replace, whose first statement would drop it; run as printed, the
// statements end OK with it kept. Before, Replace dropped it.
func TestIndexReplaceKeepsHandMadeNew(t *testing.T) {
	pool, schema, sides := leftoverSides(t)
	for _, side := range sides {
		execAll(t, pool, `DROP INDEX `+pgx.Identifier{schema, side.name}.Sanitize(),
			`CREATE INDEX `+pgx.Identifier{side.name}.Sanitize()+` ON `+side.table+` (queue)`,
			`CREATE INDEX `+pgx.Identifier{side.name + "_new"}.Sanitize()+` ON `+side.table+` (status)`)
		f := side.finding(pool)
		if !strings.Contains(f.Evidence, side.name+"_new, an index of the table defined as") {
			t.Errorf("%s: %+v; want the hand-made _new named", side.id, f)
		}
		for _, stmt := range printedStatements(t, f.Fix) {
			execAll(t, pool, stmt)
		}
		if f := side.finding(pool); f.Severity != doctor.OK {
			t.Fatalf("%s: %+v; want OK", side.id, f)
		}
		var n int
		if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_index WHERE indrelid = $1::regclass AND pg_get_indexdef(indexrelid) LIKE '%(status)'`,
			side.table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("%s: the hand-made index on (status) dropped by the fix", side.id)
		}
	}
}

// TestIndexReplacementLeftBesideRightIndex: an index as its definition has
// it, with a <name>_new left beside it (Replace run though not needed, or
// stopped after its build failed). The same index again, or an invalid
// one, is written on every write and never read: a Warn (not the index's
// own severity: it serves), fixed by a DROP of the _new. One being built is
// Info with nothing to run, and the DROP once built. A valid _new defined
// otherwise is not a replacement and is kept. Before, every case read OK
// and the _new stayed.
func TestIndexReplacementLeftBesideRightIndex(t *testing.T) {
	pool, schema, sides := leftoverSides(t)
	for _, side := range sides {
		newIdx := pgx.Identifier{schema, side.name + "_new"}.Sanitize()
		dropNew := func(f doctor.Finding, what string) {
			t.Helper()
			if f.Severity != doctor.Warn || !strings.Contains(f.Evidence, side.name+"_new beside it is "+what) {
				t.Fatalf("%s: %+v; want a Warn naming %s_new %s", side.id, f, side.name, what)
			}
			stmts := printedStatements(t, f.Fix)
			if len(stmts) != 1 || !strings.HasPrefix(stmts[0], "DROP INDEX CONCURRENTLY IF EXISTS") || !strings.Contains(stmts[0], side.name+"_new") {
				t.Fatalf("%s: fix %q; want the DROP of %s_new alone", side.id, f.Fix, side.name)
			}
			execAll(t, pool, stmts...)
			if f := side.finding(pool); f.Severity != doctor.OK {
				t.Fatalf("%s: %+v after the fix; want OK", side.id, f)
			}
			if n := relations(t, pool, schema, side.name+"_new"); n != 0 {
				t.Fatalf("%s: %s_new left after the fix", side.id, side.name)
			}
		}

		// The same index again, built.
		execAll(t, pool, side.replace[1])
		dropNew(side.finding(pool), "the same index again")

		// Invalid: a build that failed.
		execAll(t, pool, side.replace[1], `UPDATE pg_index SET indisvalid = false WHERE indexrelid = '`+newIdx+`'::regclass`)
		dropNew(side.finding(pool), "invalid")

		// Being built: nothing to run until it ends.
		finish := buildHeld(t, pool, side.insert, side.replace[1], newIdx)
		f := side.finding(pool)
		if f.Severity != doctor.Info || !strings.Contains(f.Evidence, "builds "+side.name+"_new beside it") || strings.HasPrefix(f.Fix, "run ") {
			t.Errorf("%s: %+v; want the build named, Info, nothing to run", side.id, f)
		}
		finish()
		dropNew(side.finding(pool), "the same index again")

		// Made otherwise (by hand, other columns): kept, OK.
		execAll(t, pool, `CREATE INDEX `+pgx.Identifier{side.name + "_new"}.Sanitize()+` ON `+side.table+` (updated_at)`)
		if f := side.finding(pool); f.Severity != doctor.OK {
			t.Errorf("%s: %+v; want OK beside a _new made otherwise", side.id, f)
		}
		execAll(t, pool, `DROP INDEX `+newIdx)
	}
}
