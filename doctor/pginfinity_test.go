package doctor_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/doctor"
)

// TestPostgresInfiniteTimes: rows written by hand or by another tool with an
// available_at or visibility_until of '-infinity' (which now() cannot be
// subtracted from, and no time.Time holds) or centuries ago do not fail
// berth doctor's queue checks: the oldest ready job is reported due for the
// longest Duration, the stuck one "since -infinity". Doctor failed as a
// whole ("cannot subtract infinite timestamps"), then on the scan.
func TestPostgresInfiniteTimes(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	b := open(t, u)
	ctx := testCtx(t)
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()
	publish(t, b, "inf", 1)
	publish(t, b, "ancient", 1)
	publish(t, b, "stuckinf", 1)
	for _, stmt := range []string{
		`UPDATE ` + qt + ` SET available_at = '-infinity' WHERE queue = 'inf'`,
		`UPDATE ` + qt + ` SET available_at = '1500-01-01 00:00:00+00' WHERE queue = 'ancient'`,
		`UPDATE ` + qt + ` SET status = 'processing', available_at = '-infinity', visibility_until = '-infinity' WHERE queue = 'stuckinf'`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{"inf", "ancient", "stuckinf"}})
	if err != nil {
		t.Fatalf("doctor with rows at '-infinity': %v", err)
	}
	expect(t, fs, "postgres.oldest-ready", "inf", doctor.Warn)
	expect(t, fs, "postgres.oldest-ready", "ancient", doctor.Warn)
	expect(t, fs, "postgres.stuck-processing", "stuckinf", doctor.Warn)
	for _, f := range find(fs, "postgres.oldest-ready", "") {
		if strings.Contains(f.Evidence, "-") {
			t.Errorf("oldest-ready on %q: %s; want a positive age", f.Queue, f.Evidence)
		}
	}
	for _, f := range find(fs, "postgres.stuck-processing", "stuckinf") {
		if !strings.Contains(f.Evidence, "since -infinity") {
			t.Errorf("stuck-processing: %s; want since -infinity", f.Evidence)
		}
	}
}
