package doctor_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/doctor"
)

// TestIdempotencyResultsKeptForever: results an operator keeps forever,
// with an expires_at of 'infinity' or the year 9999 (set by hand, as
// pgstore never writes them), outlive any redelivery window: OK, not a
// failed run ("cannot subtract infinite timestamps") nor a retention read
// past the longest Duration, wrapped. A claim whose lease was set to
// '-infinity' by hand is stuck like any other, not a failed scan.
func TestIdempotencyResultsKeptForever(t *testing.T) {
	pool := pgPool(t)
	ctx := testCtx(t)
	for _, forever := range []string{"infinity", "9999-12-31 00:00:00+00"} {
		table := resultsTable(t, pool, 0, nil)
		qt := pgx.Identifier{strings.TrimSuffix(table, ".job_results"), "job_results"}.Sanitize()
		if _, err := pool.Exec(ctx, `UPDATE `+qt+` SET expires_at = $1::timestamptz`, forever); err != nil {
			t.Fatal(err)
		}
		fs, err := doctor.Idempotency(ctx, pool, table, doctor.Options{})
		if err != nil {
			t.Errorf("results kept until %s: %v", forever, err)
			continue
		}
		expect(t, fs, "idempotency.retention", table, doctor.OK)
	}

	table := resultsTable(t, pool, 0, nil)
	qt := pgx.Identifier{strings.TrimSuffix(table, ".job_results"), "job_results"}.Sanitize()
	if _, err := pool.Exec(ctx, `INSERT INTO `+qt+` (idempotency_key, status, owner_token, locked_until, expires_at)
		VALUES ('charge:order_lost:v1', 'in_progress', 'w1', '-infinity', 'infinity')`); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Idempotency(ctx, pool, table, doctor.Options{})
	if err != nil {
		t.Fatalf("a claim locked until -infinity: %v", err)
	}
	expect(t, fs, "idempotency.claims-stuck", table, doctor.Warn)
}
