package doctor_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/doctor"
)

// Run on a PostgreSQL broker whose jobs table is missing reports
// postgres.table-missing; the ledger checks, which read that table, must not
// turn the run into an error that hides the finding.
func TestRunReportsMissingJobsTable(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	b := open(t, u)
	if _, err := pool.Exec(testCtx(t), `DROP TABLE `+pgx.Identifier{schema, "jobs"}.Sanitize()+` CASCADE`); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{})
	if err != nil {
		t.Fatalf("Run failed instead of reporting the missing table: %v (findings %s)", err, ids(fs))
	}
	expect(t, fs, "postgres.table-missing", schema+".jobs", doctor.Error)
}

// autovacuum_enabled keeps the text it was set with: every spelling
// PostgreSQL reads as false switches autovacuum off for the table.
func TestAutovacuumOffInAnySpelling(t *testing.T) {
	for v, off := range map[string]bool{"0": true, "no": true, "f": true, "OFF": true, "true": false, "1": false, "on": false} {
		u, pool, schema := pgURL(t, nil)
		open(t, u)
		qt := pgx.Identifier{schema, "jobs"}.Sanitize()
		if _, err := pool.Exec(testCtx(t), `ALTER TABLE `+qt+` SET (autovacuum_enabled = `+v+`)`); err != nil {
			t.Fatal(err)
		}
		fs, err := doctor.Postgres(testCtx(t), pool, schema, 0, doctor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		want := doctor.OK
		if off {
			want = doctor.Error
		}
		expect(t, fs, "postgres.autovacuum", schema+".jobs", want)
	}
}
