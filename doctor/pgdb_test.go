package doctor_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
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
	// holder is a session on the private database for as long as this
	// binary runs: it marks the database in use, so that another binary's
	// sweep (sweepStale) leaves it.
	holder *pgx.Conn
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

// createDB creates a database beside base's and returns its DSN and name,
// holding a session on it (pgDB.holder) until dropDB. First it drops the
// doctor test databases that earlier binaries left behind (sweepStale).
func createDB(base string) (dsn, name string, err error) {
	if _, err := dsnFor(base, ""); err != nil {
		return "", "", err
	}
	name = dbName(time.Now())
	err = withBase(base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a slow sweep leaves the CREATE its time
		sweepStale(sctx, conn, dbPrefix, time.Now(), nil)
		cancel()
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
	dsn, _ = dsnFor(base, name) // base parsed above
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if pgDB.holder, err = holdSession(ctx, dsn); err != nil {
		_ = forceDrop(base, name)
		return "", "", fmt.Errorf("connecting to %s: %w", name, err)
	}
	return dsn, name, nil
}

// dsnFor returns the DSN of the database name on base's server, with base's
// user and parameters; an error when base is not a postgres:// URL.
func dsnFor(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("BERTH_POSTGRES_DSN must be a postgres:// URL for the doctor tests (%q)", base)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// holdSession opens the session that marks a doctor test database in use
// (pgDB.holder) for as long as its binary runs. The session sits idle, so
// it turns the server's idle_session_timeout off for itself: with one set
// (PostgreSQL 14 on), the server would end it after that long, and a sweep
// of another binary could then drop the database under the running tests.
// The setting goes in the start-up packet, not in a SET after connecting,
// which a short timeout can beat. A server older than 14, which has no such
// timeout, refuses the setting (undefined_object): the session is opened
// without it.
func holdSession(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["idle_session_timeout"] = "0"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if undefinedObject(err) {
		delete(cfg.RuntimeParams, "idle_session_timeout")
		conn, err = pgx.ConnectConfig(ctx, cfg)
	}
	return conn, err
}

// undefinedObject reports whether err is PostgreSQL's undefined_object, its
// answer to a setting it does not have.
func undefinedObject(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42704"
}

// dbPrefix starts the name of every doctor test database; the Unix time of
// its creation and a random suffix follow (dbName).
const dbPrefix = "berth_doctor_"

// dbName is the name of a doctor test database created at t.
func dbName(t time.Time) string { return fmt.Sprintf("%s%d_%s", dbPrefix, t.Unix(), suffix()) }

// staleAfter is how old an unused doctor test database must be before a
// sweep drops it: older than any gap between its CREATE and its holder's
// connection.
const staleAfter = 10 * time.Minute

// sweepStale drops, as of now, the doctor test databases that are older
// than staleAfter and that no session uses: those of test binaries killed
// (SIGKILL, a -timeout panic) before their TestMain dropped them. A live
// binary, on this machine or another, in a container or not, keeps a
// session on its database (pgDB.holder), and DROP DATABASE without FORCE
// refuses a database in use; a name without a creation time is left
// alone. Failures are reported and ignored: a leftover database costs
// disk, not correctness.
//
// Liveness is the server's own view, not a process ID: a PID means
// nothing to a run in another PID namespace or on another machine that
// uses the same server.
//
// only, if not nil, limits the sweep to those names: a test that sweeps
// as of a later time than now must not judge old, and drop, another
// binary's database between its CREATE and its holder's connection.
//
// prefix is dbPrefix for the tests' databases; TestSweepDropsDatabasesNobodyUses
// sweeps its own timeless ones under a longer prefix (see timelessPrefix).
func sweepStale(ctx context.Context, conn *pgx.Conn, prefix string, now time.Time, only []string) {
	// Databases with a session are passed over here: a DROP of one in use
	// waits 5 s before it refuses. One whose session comes after this
	// query is still refused by the DROP.
	rows, err := conn.Query(ctx, `SELECT d.datname FROM pg_database d WHERE starts_with(d.datname, $1)
		AND ($2::text[] IS NULL OR d.datname = ANY($2))
		AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)`, prefix, only)
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
		created, ok := createdAt(name, prefix)
		if !ok || now.Sub(created) < staleAfter {
			continue
		}
		_, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "55006": // object_in_use: its binary runs
		case err != nil:
			fmt.Fprintf(os.Stderr, "doctor tests: dropping leftover database %s: %v\n", name, err)
		default:
			fmt.Fprintf(os.Stderr, "doctor tests: dropped %s, created %s and used by nobody\n", name, created.UTC().Format(time.RFC3339))
		}
	}
}

// createdAt is the creation time in the name of a doctor test database
// named prefix, Unix time, "_", suffix.
func createdAt(name, prefix string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return time.Time{}, false
	}
	digits, _, ok := strings.Cut(rest, "_")
	if !ok {
		return time.Time{}, false
	}
	sec, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || sec <= 0 {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
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
	if pgDB.holder != nil {
		_ = pgDB.holder.Close(context.Background())
	}
	return forceDrop(pgDB.base, pgDB.name)
}

// forceDrop drops the databases names on base's server, ending their
// sessions (WITH (FORCE)); it returns the first failure.
func forceDrop(base string, names ...string) error {
	return withBase(base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		var first error
		for _, name := range names {
			if _, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`); err != nil && first == nil {
				first = err
			}
		}
		return first
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

// TestSweepDropsDatabasesNobodyUses: the sweep at the doctor tests' start
// drops a database older than staleAfter that no session uses (left by a
// test binary killed before its TestMain could drop it), and leaves one in
// use (a binary that runs, anywhere), one younger than staleAfter (a binary
// between its CREATE and its first session) and one whose name carries no
// creation time. Before, a killed binary's database stayed for good.
//
// The test's databases are named as of now, so that another binary's sweep
// running meanwhile takes them for young (inUse has no session until it is
// connected below); the test sweeps as of later, and only its own databases
// and this binary's: a bystander, another binary's database between its
// CREATE and its holder's connection, old as of later, is left.
func TestSweepDropsDatabasesNobodyUses(t *testing.T) {
	postgresDSN(t)
	if pgDB.name == "" {
		t.Skip("the server refused to create a database for these tests: nothing to sweep")
	}
	ctx := testCtx(t)
	now := time.Now()
	later := now.Add(2 * staleAfter) // this binary's own database is old then too
	stale, inUse, bystander := dbName(now), dbName(now), dbName(now)
	fresh := dbName(later.Add(-staleAfter / 2))
	// foreign has no creation time where sweepStale looks for one (after
	// dbPrefix); it carries one after timelessPrefix, for the sweep below
	// that drops those of runs of this test killed before their cleanup.
	foreign := fmt.Sprintf("%s%d_%s", timelessPrefix, now.Unix(), suffix())
	names := []string{stale, inUse, fresh, foreign, bystander}
	swept := []string{stale, inUse, fresh, foreign, pgDB.name}
	err := withBase(pgDB.base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		sweepStale(ctx, conn, timelessPrefix, now, nil) // earlier runs' leftovers
		for _, name := range names {
			if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
				return err
			}
		}
		return nil
	})
	t.Cleanup(func() {
		_ = forceDrop(pgDB.base, names...)
	})
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := dsnFor(pgDB.base, inUse)
	if err != nil {
		t.Fatal(err)
	}
	user, err := pgx.Connect(ctx, dsn) // the session of a binary that runs
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close(context.Background())

	var left []string
	err = withBase(pgDB.base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		sweepStale(ctx, conn, dbPrefix, later, swept)
		left, err = existing(ctx, conn, append([]string{pgDB.name}, names...))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{inUse, fresh, foreign, bystander, pgDB.name} // this binary's own: old, and held
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("after the sweep %q remain, want %q (only the unused old %s dropped)", left, want, stale)
	}
	if err := pgDB.holder.Ping(ctx); err != nil {
		t.Fatalf("own database after a sweep that judged it old: %v", err)
	}

	// The sweep of timeless databases this test runs first drops foreign
	// once it is old, as it would a killed run's: leftovers of this test
	// do not pile up either.
	err = withBase(pgDB.base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		sweepStale(ctx, conn, timelessPrefix, later, []string{foreign})
		left, err = existing(ctx, conn, []string{foreign})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Fatalf("%s, old and unused, left by the sweep of timeless databases", foreign)
	}
}

// timelessPrefix names the database of TestSweepDropsDatabasesNobodyUses
// that has no creation time as the sweep at start-up reads one (see
// createdAt): its time follows this longer prefix instead.
const timelessPrefix = dbPrefix + "notime_"

// existing returns those of names that are databases on conn's server,
// sorted.
func existing(ctx context.Context, conn *pgx.Conn, names []string) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE datname = ANY($1) ORDER BY datname`, names)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// TestHolderOutlivesIdleSessionTimeout: the session that marks a doctor test
// database in use stays while it idles on a server that ends idle sessions
// (idle_session_timeout), however short the timeout. Before, the server
// ended it, and another binary's sweep could then drop the database under
// the running tests; and a SET sent after connecting could be beaten by a
// short timeout.
func TestHolderOutlivesIdleSessionTimeout(t *testing.T) {
	postgresDSN(t)
	if pgDB.name == "" {
		t.Skip("the server refused to create a database for these tests")
	}
	ctx := testCtx(t)
	idleFor := func(t *testing.T, timeout string) string {
		name := dbName(time.Now())
		err := withBase(pgDB.base, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
			if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
				return err
			}
			// As a server-wide setting would, for every session on it.
			_, err := conn.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET idle_session_timeout = '`+timeout+`'`)
			return err
		})
		t.Cleanup(func() { _ = forceDrop(pgDB.base, name) })
		if undefinedObject(err) {
			t.Skip("the server has no idle_session_timeout (PostgreSQL before 14)")
		}
		if err != nil {
			t.Fatal(err)
		}
		dsn, err := dsnFor(pgDB.base, name)
		if err != nil {
			t.Fatal(err)
		}
		return dsn
	}

	t.Run("idle", func(t *testing.T) {
		dsn := idleFor(t, "200ms")
		plain, err := pgx.Connect(ctx, dsn) // the check has teeth: this one is ended
		if err != nil {
			t.Fatal(err)
		}
		defer plain.Close(context.Background())
		holder, err := holdSession(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close(context.Background())
		time.Sleep(time.Second) // five timeouts
		if err := plain.Ping(ctx); err == nil {
			t.Fatal("a plain session outlived idle_session_timeout: the server does not end idle sessions, nothing is tested")
		}
		if err := holder.Ping(ctx); err != nil {
			t.Fatalf("holder after idling past idle_session_timeout: %v", err)
		}
	})
	t.Run("opening", func(t *testing.T) {
		// A millisecond: a session that turned it off only once connected
		// was ended before its SET in a few openings of fifty.
		dsn := idleFor(t, "1ms")
		for i := range 50 {
			holder, err := holdSession(ctx, dsn)
			if err != nil {
				t.Fatalf("opening %d: %v", i, err)
			}
			err = holder.Ping(ctx)
			_ = holder.Close(context.Background())
			if err != nil {
				t.Fatalf("opening %d: %v", i, err)
			}
		}
	})
}
