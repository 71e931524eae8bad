package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/doctor"
)

// TestPostgresIndexDefinitions: an index of the jobs table with the right
// name that is not the one schema.sql creates (older columns, another
// predicate, UNIQUE; the dedupe index not unique) is reported with what
// the database holds and the statements that replace it. Before, doctor
// counted an index by its name and passed them all. Storage parameters are
// no mismatch; Migrate keeps the wrong ones; the fix statements replace
// them.
func TestPostgresIndexDefinitions(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	table := schema + ".jobs"
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()
	b, err := postgres.New(pool, postgres.Options{Schema: schema, DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	check := func(sev doctor.Severity) doctor.Finding {
		t.Helper()
		fs, err := doctor.Postgres(ctx, pool, schema, 0, doctor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		expect(t, fs, "postgres.indexes", table, sev)
		f := find(fs, "postgres.indexes", table)
		if len(f) != 1 {
			t.Fatalf("postgres.indexes: %+v", f)
		}
		return f[0]
	}
	// fix runs the statements the finding's fix names, one by one
	// (CONCURRENTLY: outside a transaction).
	fix := func() {
		t.Helper()
		for _, ix := range postgres.Indexes() {
			var def string
			err := pool.QueryRow(ctx, `SELECT COALESCE(pg_get_indexdef(to_regclass($1)), '')`, pgx.Identifier{schema, ix.Name}.Sanitize()).Scan(&def)
			if err != nil {
				t.Fatal(err)
			}
			if ix.Matches(def) {
				continue
			}
			for _, stmt := range []string{ix.Drop(schema), ix.Create(schema)} {
				if _, err := pool.Exec(ctx, stmt); err != nil {
					t.Fatalf("%s: %v", stmt, err)
				}
			}
		}
	}

	// An index tuned by a DBA (fillfactor) is still the index.
	if _, err := pool.Exec(ctx, `ALTER INDEX `+pgx.Identifier{schema, "jobs_completed_idx"}.Sanitize()+` SET (fillfactor = 80)`); err != nil {
		t.Fatal(err)
	}
	if f := check(doctor.OK); !strings.Contains(f.Evidence, "5 indexes, none missing") {
		t.Errorf("evidence: %s", f.Evidence)
	}

	const hostile = "\x1b[31m\u202e"
	drop := func(name string) string { return `DROP INDEX ` + pgx.Identifier{schema, name}.Sanitize() }
	for _, stmt := range []string{
		drop("jobs_dead_letter_page_idx"), // an earlier release's columns
		`CREATE INDEX jobs_dead_letter_page_idx ON ` + qt + ` (queue, updated_at) WHERE status = 'dead_letter'`,
		drop("jobs_completed_idx"), // another predicate, with control characters in it
		`CREATE INDEX jobs_completed_idx ON ` + qt + ` (updated_at) WHERE status <> '` + hostile + `'`,
		drop("jobs_dead_letter_idx"), // unique: the same columns, refusing rows
		`CREATE UNIQUE INDEX jobs_dead_letter_idx ON ` + qt + ` (queue, message_id) WHERE status = 'dead_letter'`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	f := check(doctor.Warn)
	for _, want := range []string{
		`jobs_dead_letter_page_idx defined as "CREATE INDEX jobs_dead_letter_page_idx ON ` + table + ` USING btree (queue, updated_at) WHERE (status = 'dead_letter'::text)", not as schema.sql has it ("btree (queue, updated_at, id) WHERE (status = 'dead_letter'::text)")`,
		`WHERE (status <> '` + hostile + `'::text)`, // as read: berth doctor escapes it on the terminal
		`jobs_dead_letter_idx defined as "CREATE UNIQUE INDEX`,
	} {
		if !strings.Contains(f.Evidence, want) {
			t.Errorf("evidence lacks %q:\n%s", want, f.Evidence)
		}
	}
	for _, name := range []string{"jobs_claim_idx", "jobs_dedupe_idx"} {
		if strings.Contains(f.Evidence, name) {
			t.Errorf("evidence names the matching index %s: %s", name, f.Evidence)
		}
	}
	for _, want := range []string{
		`DROP INDEX CONCURRENTLY IF EXISTS "` + schema + `"."jobs_dead_letter_page_idx_new"; CREATE INDEX CONCURRENTLY IF NOT EXISTS "jobs_dead_letter_page_idx_new" ON "` + schema + `"."jobs" USING btree (queue, updated_at, id) WHERE (status = 'dead_letter'::text); ` +
			`DROP INDEX CONCURRENTLY IF EXISTS "` + schema + `"."jobs_dead_letter_page_idx"; ALTER INDEX "` + schema + `"."jobs_dead_letter_page_idx_new" RENAME TO "jobs_dead_letter_page_idx"`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "jobs_completed_idx_new" ON "` + schema + `"."jobs" USING btree (updated_at) WHERE (status = 'completed'::text)`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "jobs_dead_letter_idx_new" ON "` + schema + `"."jobs" USING btree (queue, message_id) WHERE (status = 'dead_letter'::text)`,
	} {
		if !strings.Contains(f.Fix, want) {
			t.Errorf("fix lacks %q:\n%s", want, f.Fix)
		}
	}
	// Migrate keeps them (IF NOT EXISTS); the statements of the fix
	// replace them.
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	check(doctor.Warn)
	fix()
	check(doctor.OK)

	// The dedupe index not unique: ON CONFLICT cannot use it, and enqueue
	// dedupe fails, as with none.
	for _, stmt := range []string{
		drop("jobs_dedupe_idx"),
		`CREATE INDEX jobs_dedupe_idx ON ` + qt + ` (queue, idempotency_key) WHERE dedupe`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	f = check(doctor.Error)
	if !strings.Contains(f.Evidence, `jobs_dedupe_idx defined as "CREATE INDEX jobs_dedupe_idx`) ||
		!strings.Contains(f.Fix, `CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS "jobs_dedupe_idx_new" ON "`+schema+`"."jobs" USING btree (queue, idempotency_key) WHERE dedupe`) {
		t.Errorf("postgres.indexes: %+v", f)
	}
	fix()
	check(doctor.OK)
}

// TestPostgresIndexFailureIsAFinding: the index query failing is an Info
// postgres.indexes finding; the other checks of the jobs table stand.
// Before, the error ended the run with no finding at all. The failure is
// PostgreSQL's own: a pool whose search_path puts the test's schema before
// pg_catalog finds there a pg_index that refuses to be read, as a catalog
// doctor's user may not read.
func TestPostgresIndexFailureIsAFinding(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	table := schema + ".jobs"
	qs := pgx.Identifier{schema}.Sanitize()
	for _, stmt := range []string{
		`CREATE FUNCTION ` + qs + `.refuse() RETURNS SETOF pg_catalog.pg_index LANGUAGE plpgsql AS
		$$BEGIN RAISE insufficient_privilege USING MESSAGE = 'permission denied for table pg_index'; END$$`,
		`CREATE VIEW ` + qs + `.pg_index AS SELECT * FROM ` + qs + `.refuse()`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	cfg, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = qs + ", pg_catalog"
	shadowed, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(shadowed.Close)
	fs, err := doctor.Postgres(ctx, shadowed, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatalf("Postgres: %v; want the failure as a finding", err)
	}
	expect(t, fs, "postgres.indexes", table, doctor.Info)
	if f := find(fs, "postgres.indexes", table); len(f) != 1 || !strings.Contains(f[0].Evidence, "permission denied for table pg_index") ||
		!strings.Contains(f[0].Summary, "not checked") {
		t.Errorf("postgres.indexes: %+v; want the failure, not checked", f)
	}
	for _, id := range []string{"postgres.autovacuum", "postgres.dead-tuples"} {
		if len(find(fs, id, table)) != 1 {
			t.Errorf("%s dropped: %s", id, ids(fs))
		}
	}
	if len(find(fs, "clock.skew", "")) != 1 {
		t.Errorf("clock.skew dropped: %s", ids(fs))
	}
}

// TestPostgresIndexBuildUnderWay: an index a CREATE INDEX CONCURRENTLY is
// still building (invalid until it ends, as RUNBOOK has operators build
// jobs_dead_letter_page_idx on a large table) is reported as being built,
// an Info finding with nothing to run. Before, it was "invalid, never
// read", a Warn whose fix dropped it: DROP INDEX CONCURRENTLY waits for the
// build, then throws it away.
func TestPostgresIndexBuildUnderWay(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	table := schema + ".jobs"
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()
	const name = "jobs_dead_letter_page_idx"
	if _, err := pool.Exec(ctx, `DROP INDEX `+pgx.Identifier{schema, name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	var ix postgres.Index
	for _, x := range postgres.Indexes() {
		if x.Name == name {
			ix = x
		}
	}
	finish := buildHeld(t, pool, `INSERT INTO `+qt+` (queue, message_id, payload, max_attempts) VALUES ('q', 'm', '\x00', 1)`,
		ix.Create(schema), pgx.Identifier{schema, name}.Sanitize())
	fs, err := doctor.Postgres(ctx, pool, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "postgres.indexes", table, doctor.Info)
	if f := find(fs, "postgres.indexes", table); len(f) != 1 || !strings.Contains(f[0].Evidence, name+" being built") ||
		strings.Contains(f[0].Fix, "DROP INDEX") {
		t.Errorf("postgres.indexes: %+v; want the build under way, and no DROP", f)
	}
	finish()
	fs, err = doctor.Postgres(ctx, pool, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "postgres.indexes", table, doctor.OK)
}

// TestPostgresIndexNameHeldElsewhere: a jobs table renamed away (kept as
// an archive) takes its indexes' names along; the new table Migrate makes
// gets none of them, as CREATE INDEX IF NOT EXISTS skips a name the
// schema holds. doctor says so, and its fix renames the holder first.
// Before, it reported them missing with a fix (CREATE INDEX CONCURRENTLY
// IF NOT EXISTS) that skipped them again.
func TestPostgresIndexNameHeldElsewhere(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	table := schema + ".jobs"
	if _, err := pool.Exec(ctx, `ALTER TABLE `+pgx.Identifier{schema, "jobs"}.Sanitize()+` RENAME TO jobs_2025`); err != nil {
		t.Fatal(err)
	}
	b, err := postgres.New(pool, postgres.Options{Schema: schema, DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Postgres(ctx, pool, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "postgres.indexes", table, doctor.Error)
	f := find(fs, "postgres.indexes", table)
	if len(f) != 1 {
		t.Fatalf("postgres.indexes: %+v", f)
	}
	for _, ix := range postgres.Indexes() {
		if !strings.Contains(f[0].Evidence, ix.Name+" missing, its name held in the schema by an index of jobs_2025") {
			t.Errorf("evidence lacks %s held by jobs_2025: %s", ix.Name, f[0].Evidence)
		}
		rename := `ALTER INDEX ` + pgx.Identifier{schema, ix.Name}.Sanitize() + ` RENAME TO ` + pgx.Identifier{ix.Name + "_old"}.Sanitize()
		if !strings.Contains(f[0].Fix, rename) {
			t.Errorf("fix lacks %s: %s", rename, f[0].Fix)
		}
		for _, stmt := range []string{rename, ix.Create(schema)} {
			if _, err := pool.Exec(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
	}
	fs, err = doctor.Postgres(ctx, pool, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "postgres.indexes", table, doctor.OK)
}

// buildHeld starts create, a CREATE INDEX CONCURRENTLY of index (quoted,
// qualified), held in its first wait, the index in the catalog and
// invalid, by a transaction that ran insert and stays open. The function
// it returns commits that transaction and waits for the build to end.
func buildHeld(t *testing.T, pool *pgxpool.Pool, insert, create, index string) (finish func()) {
	t.Helper()
	ctx := testCtx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, insert); err != nil {
		t.Fatal(err)
	}
	built := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, create)
		built <- err
	}()
	done := false
	t.Cleanup(func() {
		if !done {
			_ = tx.Rollback(context.Background())
			<-built
		}
	})
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_index WHERE indexrelid = to_regclass($1) AND NOT indisvalid`, index).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		select {
		case err := <-built:
			done = true
			t.Fatalf("the build ended before it was seen: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return func() {
		t.Helper()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		done = true
		if err := <-built; err != nil {
			t.Fatalf("%s: %v", create, err)
		}
	}
}

// TestPostgresIndexReplaceKeepsOldServing: the fix for an index defined
// otherwise builds the new one under another name before it drops the old
// one, so that the table is never without an index of the name's columns
// while the build runs (the claim index: every claim would scan the whole
// table). Before, the fix dropped the old index first.
func TestPostgresIndexReplaceKeepsOldServing(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	table := schema + ".jobs"
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()
	// The claim index of an earlier release: no expired leases.
	for _, stmt := range []string{
		`DROP INDEX ` + pgx.Identifier{schema, "jobs_claim_idx"}.Sanitize(),
		`CREATE INDEX jobs_claim_idx ON ` + qt + ` (queue, available_at) WHERE status IN ('queued', 'retry')`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	fs, err := doctor.Postgres(ctx, pool, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "postgres.indexes", table, doctor.Warn)
	f := find(fs, "postgres.indexes", table)
	if len(f) != 1 {
		t.Fatalf("postgres.indexes: %+v", f)
	}
	name := pgx.Identifier{schema, "jobs_claim_idx"}.Sanitize()
	tmp := pgx.Identifier{schema, "jobs_claim_idx_new"}.Sanitize()
	stmts := []string{
		`DROP INDEX CONCURRENTLY IF EXISTS ` + tmp,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "jobs_claim_idx_new" ON ` + qt +
			` USING btree (queue, available_at) WHERE (status = ANY (ARRAY['queued'::text, 'retry'::text, 'processing'::text]))`,
		`DROP INDEX CONCURRENTLY IF EXISTS ` + name,
		`ALTER INDEX ` + tmp + ` RENAME TO "jobs_claim_idx"`,
	}
	if !strings.Contains(f[0].Fix, "run "+strings.Join(stmts, "; ")+" (") {
		t.Fatalf("fix: %s\nwant: run %s", f[0].Fix, strings.Join(stmts, "; "))
	}
	execKeepingValid(t, pool, stmts, name, tmp, "claim")
	fs, err = doctor.Postgres(ctx, pool, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "postgres.indexes", table, doctor.OK)
}

// execKeepingValid runs stmts one by one and checks after each that a
// valid index (what) stands under name or tmp: a replacement never leaves
// the queries it serves without one.
func execKeepingValid(t *testing.T, pool *pgxpool.Pool, stmts []string, name, tmp, what string) {
	t.Helper()
	ctx := testCtx(t)
	for _, stmt := range stmts {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_index WHERE indisvalid AND indexrelid IN (to_regclass($1), to_regclass($2))`,
			name, tmp).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("after %s, no valid %s index", stmt, what)
		}
	}
}
