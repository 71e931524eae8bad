package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/doctor"
)

// slowView replaces the table schema.name with a view of it that has the
// columns cols, where reading column slow of a row whose status is status
// sleeps a minute (pg_sleep): a stand-in, without a huge table, for a scan
// that outlasts doctor's budget. Queries that never read that column of
// such a row answer at once.
func slowView(t *testing.T, pool *pgxpool.Pool, schema, name, slow, status string, cols ...string) {
	t.Helper()
	ctx := testCtx(t)
	s := pgx.Identifier{schema}.Sanitize()
	sel := make([]string, 0, len(cols)+1)
	for _, c := range cols {
		sel = append(sel, pgx.Identifier{c}.Sanitize())
	}
	sc := pgx.Identifier{slow}.Sanitize()
	sel = append(sel, `CASE WHEN status = '`+status+`' THEN `+s+`.slow(`+sc+`) ELSE `+sc+` END AS `+sc)
	for _, q := range []string{
		`CREATE FUNCTION ` + s + `.slow(v anyelement) RETURNS anyelement LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(60); RETURN v; END $$`,
		`ALTER TABLE ` + pgx.Identifier{schema, name}.Sanitize() + ` RENAME TO ` + pgx.Identifier{name + "_data"}.Sanitize(),
		`CREATE VIEW ` + pgx.Identifier{schema, name}.Sanitize() + ` AS SELECT ` + strings.Join(sel, ", ") +
			` FROM ` + pgx.Identifier{schema, name + "_data"}.Sanitize(),
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// TestPostgresQueueUnknownScanCut: the scan of the queue names behind
// postgres.queue-unknown (a DISTINCT over the whole jobs table) is bounded.
// When it outlasts its share of the check's budget, as on a huge table, it
// is cut, and an Info finding says so; the job table's other findings stand.
// Before, the scan ran until CheckTimeout, and the whole PostgreSQL check
// came back as one doctor.check-timeout error, its other findings lost.
func TestPostgresQueueUnknownScanCut(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	b := open(t, u)
	ctx := testCtx(t)
	publish(t, b, "billing", 1)
	ds, err := b.Receive(ctx, "billing", 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	// Reading the queue of a completed row is slow: the DISTINCT reads it,
	// the per-queue checks (waiting and running rows) do not.
	slowView(t, pool, schema, "jobs", "queue", "completed", "status", "visibility_until", "available_at", "max_attempts")

	start := time.Now()
	fs, err := doctor.Postgres(ctx, pool, schema, 0, doctor.Options{Queues: []string{"biling"}, CheckTimeout: 6 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the check took %s, want the scan cut well within its budget", took)
	}
	if f := find(fs, "doctor.check-timeout", ""); len(f) != 0 {
		t.Errorf("the whole check timed out: %+v", f)
	}
	expect(t, fs, "postgres.queue-unknown", "biling", doctor.Info)
	if f := find(fs, "postgres.queue-unknown", "biling"); len(f) == 1 &&
		(!strings.Contains(f[0].Summary, "not checked") || !strings.Contains(f[0].Evidence, "statement_timeout")) {
		t.Errorf("the finding does not say the scan was cut, and why: %+v", f[0])
	}
	if f := find(fs, "postgres.autovacuum-server", schema+".jobs"); len(f) != 1 { // whatever the server's setting
		t.Errorf("the check's other findings are missing: have %+v", fs)
	}
}

// TestIdempotencyRetentionScanCut: the retention check's scan (the latest
// results by completed_at, which no index serves) is bounded: when it
// outlasts its share of the budget it is cut, and an Info finding says so;
// the claims check still runs. Before, the scan ran on, and the check failed
// with its context's deadline.
func TestIdempotencyRetentionScanCut(t *testing.T) {
	pool := pgPool(t)
	table := resultsTable(t, pool, 30*24*time.Hour, nil)
	schema, name, _ := strings.Cut(table, ".")
	slowView(t, pool, schema, name, "completed_at", "completed", "idempotency_key", "status", "expires_at", "locked_until")

	ctx, cancel := context.WithTimeout(testCtx(t), 6*time.Second) // the scan's budget half of it: 3 s
	defer cancel()
	start := time.Now()
	fs, err := doctor.Idempotency(ctx, pool, table, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the check took %s, want the scan cut well within its budget", took)
	}
	expect(t, fs, "idempotency.retention", table, doctor.Info)
	if f := find(fs, "idempotency.retention", table); len(f) == 1 &&
		(!strings.Contains(f[0].Summary, "not checked") || !strings.Contains(f[0].Evidence, "statement_timeout")) {
		t.Errorf("the finding does not say the scan was cut, and why: %+v", f[0])
	}
	expect(t, fs, "idempotency.claims-stuck", table, doctor.OK)
}

// TestIdempotencyClaimsStuckScanCut: the scan behind
// idempotency.claims-stuck (in-progress claims by locked_until, which no
// index serves) is bounded as the retention scan is: cut, it is an Info
// finding that says so, and the other findings stand.
func TestIdempotencyClaimsStuckScanCut(t *testing.T) {
	pool := pgPool(t)
	table := resultsTable(t, pool, 30*24*time.Hour, nil)
	schema, name, _ := strings.Cut(table, ".")
	if _, err := pool.Exec(testCtx(t), `INSERT INTO `+pgx.Identifier{schema, name}.Sanitize()+
		` (idempotency_key, status, owner_token, locked_until, expires_at) VALUES ('stuck', 'in_progress', 'o', now() - interval '1 day', now() + interval '30 days')`); err != nil {
		t.Fatal(err)
	}
	slowView(t, pool, schema, name, "locked_until", "in_progress", "idempotency_key", "status", "completed_at", "expires_at")

	ctx, cancel := context.WithTimeout(testCtx(t), 6*time.Second) // the scan's budget half of it: 3 s
	defer cancel()
	fs, err := doctor.Idempotency(ctx, pool, table, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "idempotency.claims-stuck", table, doctor.Info)
	if f := find(fs, "idempotency.claims-stuck", table); len(f) == 1 &&
		(!strings.Contains(f[0].Summary, "not checked") || !strings.Contains(f[0].Evidence, "statement_timeout")) {
		t.Errorf("the finding does not say the scan was cut, and why: %+v", f[0])
	}
	expect(t, fs, "idempotency.retention", table, doctor.OK)
}
