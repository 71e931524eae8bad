package doctor_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
// First it drops the databases that earlier doctor test binaries on this
// machine left behind (sweepStale).
func createDB(base string) (dsn, name string, err error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", "", fmt.Errorf("BERTH_POSTGRES_DSN must be a postgres:// URL for the doctor tests (%q)", base)
	}
	name = fmt.Sprintf("%s%d_%s", dbPrefix, os.Getpid(), suffix())
	err = withBase(base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		if loopback(u.Hostname()) {
			sweepStale(ctx, conn)
		}
		_, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
		return err
	})
	if err != nil {
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

// dbPrefix starts the name of every doctor test database; the test
// binary's process ID and a random suffix follow.
const dbPrefix = "berth_doctor_"

// sweepStale drops the doctor test databases whose test binary, a process
// of this machine, is gone: one killed (SIGKILL, a -timeout panic) before
// its TestMain dropped its database. A database whose process still runs
// (another run beside this one) is left alone, and so is one whose name
// carries no process ID. Failures are reported and ignored: a leftover
// database costs disk, not correctness.
func sweepStale(ctx context.Context, conn *pgx.Conn) {
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE starts_with(datname, $1)`, dbPrefix)
	if err != nil {
		fmt.Fprintf(os.Stderr, "doctor tests: listing leftover databases: %v\n", err)
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		fmt.Fprintf(os.Stderr, "doctor tests: listing leftover databases: %v\n", err)
		return
	}
	for _, name := range names {
		pid, ok := ownerPID(name)
		if !ok || processAlive(pid) {
			continue
		}
		if _, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`); err != nil {
			fmt.Fprintf(os.Stderr, "doctor tests: dropping leftover database %s: %v\n", name, err)
			continue
		}
		fmt.Fprintf(os.Stderr, "doctor tests: dropped %s, left by test process %d, which is gone\n", name, pid)
	}
}

// ownerPID is the process ID in a doctor test database's name.
func ownerPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, dbPrefix)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "_")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(digits)
	return pid, err == nil && pid > 0
}

// processAlive reports whether process pid exists on this machine. A
// process of another user counts (EPERM): it is not ours to judge.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// loopback reports whether host names this machine: only then are the
// process IDs in database names this machine's. A Unix socket directory
// ("/var/run/postgresql") or no host at all is local too.
func loopback(host string) bool {
	if host == "" || host == "localhost" || strings.HasPrefix(host, "/") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// withBase runs f on a connection to the shared database base, which it
// closes after; timeout bounds both.
func withBase(base string, timeout time.Duration, f func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return f(ctx, conn)
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
	err := withBase(pgDB.base, 10*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, `SELECT pid, coalesce(datname, ''), coalesce(usename, ''), coalesce(application_name, ''),
			coalesce(state, ''), coalesce(backend_xmin::text, ''), coalesce((now() - xact_start)::text, ''),
			coalesce(wait_event_type || ':' || wait_event, ''), left(coalesce(query, ''), 200)
			FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND (now() - xact_start > interval '30 seconds' OR backend_xmin IS NOT NULL AND now() - query_start > interval '30 seconds')`)
		if err != nil {
			return err
		}
		defer rows.Close()
		fmt.Fprintln(os.Stderr, "doctor tests failed; sessions with a transaction or snapshot older than 30 s:")
		for rows.Next() {
			var pid int32
			var db, user, app, state, xmin, age, wait, query string
			if err := rows.Scan(&pid, &db, &user, &app, &state, &xmin, &age, &wait, &query); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "  pid %d db %q user %q app %q %s xmin %s for %s wait %s: %q\n", pid, db, user, app, state, xmin, age, wait, query)
		}
		return rows.Err()
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "doctor tests: reading pg_stat_activity: %v\n", err)
	}
}

// dropDB drops the doctor tests' own database, if one was created; its
// connections are ended (WITH (FORCE)), the tests being over.
func dropDB() error {
	if pgDB.name == "" {
		return nil
	}
	return withBase(pgDB.base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{pgDB.name}.Sanitize()+` WITH (FORCE)`)
		return err
	})
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

// TestSweepDropsDatabasesOfGoneProcesses: the sweep at the doctor tests'
// start drops a database left by a test binary that is gone (killed before
// its TestMain could drop it), and leaves one whose process runs and one
// whose name carries no process ID. Before, a killed binary's database
// stayed on the server for good.
func TestSweepDropsDatabasesOfGoneProcesses(t *testing.T) {
	postgresDSN(t)
	if pgDB.name == "" {
		t.Skip("the server refused to create a database for these tests: nothing to sweep")
	}
	gone := exec.Command("true") // a process that has ended: its PID names no process now
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("%s%d_%s", dbPrefix, gone.Process.Pid, suffix())
	alive := fmt.Sprintf("%s%d_%s", dbPrefix, os.Getpid(), suffix())
	foreign := dbPrefix + "nopid" + suffix()
	names := []string{dead, alive, foreign}
	err := withBase(pgDB.base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		for _, name := range names {
			if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
				return err
			}
		}
		return nil
	})
	t.Cleanup(func() {
		_ = withBase(pgDB.base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
			for _, name := range names {
				_, _ = conn.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	err = withBase(pgDB.base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		sweepStale(ctx, conn)
		rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE datname = ANY($1) ORDER BY datname`, names)
		if err != nil {
			return err
		}
		left, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{alive, foreign}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("after the sweep %q remain, want %q (only the gone process's %s dropped)", left, want, dead)
	}
	// This binary's own database survives its own sweep (its process runs).
	if pid, ok := ownerPID(pgDB.name); !ok || pid != os.Getpid() {
		t.Fatalf("own database %q: owner %d, %v; want this process, %d", pgDB.name, pid, ok, os.Getpid())
	}
}
