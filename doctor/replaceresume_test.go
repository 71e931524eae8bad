package doctor_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/doctor"
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
