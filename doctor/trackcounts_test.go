package doctor_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
)

// TestPostgresTrackCountsOff: autovacuum runs on the counts of dead tuples
// that the server collects only with track_counts on ("track_counts must
// be set to true for autovacuum to work", PostgreSQL's manual). With it off
// (here for the jobs table's database, which the server allows), no table
// of the database is ever vacuumed automatically and n_dead_tup stays 0.
// Doctor read autovacuum = on and the zero counts, and reported autovacuum
// on and dead tuples under control while the table bloated.
func TestPostgresTrackCountsOff(t *testing.T) {
	base := integration.PostgresDSN(t)
	name := dbName(time.Now())
	err := withBase(base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
			return err
		}
		_, err := conn.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET track_counts = off`)
		return err
	})
	t.Cleanup(func() { _ = forceDrop(base, name) })
	if err != nil {
		t.Skipf("cannot make a database with track_counts off: %v", err)
	}
	dsn, err := dsnFor(base, name)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", "doctor_tc")
	q.Set("migrate", "true")
	q.Set("listen", "false")
	u.RawQuery = q.Encode()
	b := open(t, u.String())
	publish(t, b, "billing", 1)
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{"billing"}})
	if err != nil {
		t.Fatal(err)
	}
	table := "doctor_tc.jobs"
	// The test server may run with autovacuum off: the finding must name
	// track_counts whatever autovacuum is.
	expect(t, fs, "postgres.autovacuum-server", table, doctor.Error)
	for _, f := range find(fs, "postgres.autovacuum-server", table) {
		if !strings.Contains(f.Evidence, "track_counts = off") {
			t.Errorf("postgres.autovacuum-server evidence %q does not name track_counts", f.Evidence)
		}
	}
	expect(t, fs, "postgres.dead-tuples", table, doctor.Info)
}
