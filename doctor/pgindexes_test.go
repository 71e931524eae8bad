package doctor_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
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
		`DROP INDEX CONCURRENTLY IF EXISTS "` + schema + `"."jobs_dead_letter_page_idx"; CREATE INDEX CONCURRENTLY IF NOT EXISTS "jobs_dead_letter_page_idx" ON "` + schema + `"."jobs" USING btree (queue, updated_at, id) WHERE (status = 'dead_letter'::text)`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "jobs_completed_idx" ON "` + schema + `"."jobs" USING btree (updated_at) WHERE (status = 'completed'::text)`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "jobs_dead_letter_idx" ON "` + schema + `"."jobs" USING btree (queue, message_id) WHERE (status = 'dead_letter'::text)`,
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
		!strings.Contains(f.Fix, `CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS "jobs_dedupe_idx" ON "`+schema+`"."jobs" USING btree (queue, idempotency_key) WHERE dedupe`) {
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
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
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
