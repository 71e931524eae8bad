package doctor_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/berthq/berth/integration"
)

// pgDB is the database the doctor tests use: one of this test binary's own,
// created at first use on the server of [integration.PostgresDSN] and
// dropped when the binary ends.
//
// CREATE INDEX CONCURRENTLY, which these tests run (as RUNBOOK has operators
// run it), waits for every transaction in its database that holds an older
// snapshot, whatever table it touches. In the shared database, another
// package's test running at the same time (go test runs packages side by
// side) can hold one for a minute or more, a statement left running after its
// client went, for one; every build here then waits out its deadline. A
// database of their own leaves only this package's own transactions to wait
// for.
var pgDB struct {
	once sync.Once
	base string // the shared database's DSN, to drop the private one from
	name string // the private database; "" if the shared one is used
	dsn  string
	err  error
}

// postgresDSN returns the DSN of the doctor tests' own database (see pgDB).
// Where the server refuses to create one (the configured role lacks
// CREATEDB), the tests use the shared database, and say so once.
func postgresDSN(t *testing.T) string {
	t.Helper()
	base := integration.PostgresDSN(t)
	pgDB.once.Do(func() {
		pgDB.base = base
		pgDB.dsn, pgDB.name, pgDB.err = createDB(base)
	})
	if pgDB.err != nil {
		t.Fatalf("doctor tests' database: %v", pgDB.err)
	}
	return pgDB.dsn
}

// createDB creates a database beside base's and returns its DSN and name.
func createDB(base string) (dsn, name string, err error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", "", fmt.Errorf("BERTH_POSTGRES_DSN must be a postgres:// URL for the doctor tests (%q)", base)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", "", err
	}
	defer conn.Close(context.Background())
	name = "berth_doctor_" + suffix()
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
			fmt.Fprintf(os.Stderr, "doctor tests: cannot create a database of their own (%v); using the shared one, where another package's long transaction can stall CREATE INDEX CONCURRENTLY\n", err)
			return base, "", nil
		}
		return "", "", fmt.Errorf("CREATE DATABASE %s: %w", name, err)
	}
	u.Path = "/" + name
	return u.String(), name, nil
}

// reportSnapshots prints to stderr the server's sessions that hold a
// snapshot or a transaction open for more than 30 s, in any database: what
// a CREATE INDEX CONCURRENTLY that ran out of time may have waited for.
// TestMain calls it when a test failed, so that a failed run says who held
// the builds up.
func reportSnapshots() {
	if pgDB.base == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgDB.base)
	if err != nil {
		fmt.Fprintf(os.Stderr, "doctor tests: reading pg_stat_activity: %v\n", err)
		return
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT pid, coalesce(datname, ''), coalesce(usename, ''), coalesce(application_name, ''),
		coalesce(state, ''), coalesce(backend_xmin::text, ''), coalesce((now() - xact_start)::text, ''),
		coalesce(wait_event_type || ':' || wait_event, ''), left(coalesce(query, ''), 200)
		FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND (now() - xact_start > interval '30 seconds' OR backend_xmin IS NOT NULL AND now() - query_start > interval '30 seconds')`)
	if err != nil {
		fmt.Fprintf(os.Stderr, "doctor tests: reading pg_stat_activity: %v\n", err)
		return
	}
	defer rows.Close()
	fmt.Fprintln(os.Stderr, "doctor tests failed; sessions with a transaction or snapshot older than 30 s:")
	for rows.Next() {
		var pid int32
		var db, user, app, state, xmin, age, wait, query string
		if err := rows.Scan(&pid, &db, &user, &app, &state, &xmin, &age, &wait, &query); err != nil {
			fmt.Fprintf(os.Stderr, "  %v\n", err)
			return
		}
		fmt.Fprintf(os.Stderr, "  pid %d db %q user %q app %q %s xmin %s for %s wait %s: %q\n", pid, db, user, app, state, xmin, age, wait, query)
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "  %v\n", err)
	}
}

// dropDB drops the doctor tests' own database, if one was created; its
// connections are ended (WITH (FORCE)), the tests being over.
func dropDB() error {
	if pgDB.name == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgDB.base)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{pgDB.name}.Sanitize()+` WITH (FORCE)`)
	return err
}

// TestOwnDatabaseIgnoresSharedSnapshots: a transaction holding a snapshot in
// the shared database (as another package's test may, running beside these)
// does not hold up a CREATE INDEX CONCURRENTLY in the doctor tests'
// database. Before, the tests used the shared database, and every build in
// them waited for such a transaction, to their 60-second deadline.
func TestOwnDatabaseIgnoresSharedSnapshots(t *testing.T) {
	dsn := postgresDSN(t)
	if pgDB.name == "" {
		t.Skip("the server refused to create a database for these tests: they use the shared one")
	}
	ctx := testCtx(t)
	shared, err := pgx.Connect(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shared.Close(context.Background()) })
	tx, err := shared.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	own, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = own.Close(context.Background()) })
	table := pgx.Identifier{"doctor_snap_" + suffix()}.Sanitize()
	if _, err := own.Exec(ctx, `CREATE TABLE `+table+` (id int)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = own.Exec(context.Background(), `DROP TABLE IF EXISTS `+table) })
	// A partial index: a build of one is waited for by other builds, as the
	// doctor tests' are (PostgreSQL skips only plain-column builds).
	built, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := own.Exec(built, `CREATE INDEX CONCURRENTLY ON `+table+` (id) WHERE id > 0`); err != nil {
		t.Fatalf("CREATE INDEX CONCURRENTLY beside a snapshot held in the shared database: %v", err)
	}
}
