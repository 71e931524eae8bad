package doctor_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/sdk"
)

// pgURL returns a broker URL on a fresh schema, migrated, with params, and
// a pool to misconfigure it with. The schema is dropped when the test ends.
func pgURL(t *testing.T, params url.Values) (string, *pgxpool.Pool, string) {
	t.Helper()
	dsn := postgresDSN(t)
	ctx := testCtx(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := "doctor_" + suffix()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", schema)
	q.Set("migrate", "true")
	q.Set("listen", "false")
	for k, v := range params {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	return u.String(), pool, schema
}

func publish(t *testing.T, b sdk.Broker, queue string, n int) {
	t.Helper()
	for range n {
		if err := b.Publish(testCtx(t), queue, &sdk.Message{Type: "doctor.test", Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPostgresDefaultsPass(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	b := open(t, u)
	publish(t, b, "billing", 3)
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	table := schema + ".jobs"
	// autovacuum is a server setting, not berth's: the shared test server
	// may run without it (then the check must say so).
	var av string
	if err := pool.QueryRow(testCtx(t), `SHOW autovacuum`).Scan(&av); err != nil {
		t.Fatal(err)
	}
	serverOff := av != "on"
	var rest []doctor.Finding
	for _, f := range fs {
		if f.ID != "postgres.autovacuum-server" {
			rest = append(rest, f)
		}
	}
	clean(t, rest)
	if serverOff {
		expect(t, fs, "postgres.autovacuum-server", table, doctor.Error)
	} else {
		expect(t, fs, "postgres.autovacuum-server", table, doctor.OK)
	}
	for _, id := range []string{"postgres.indexes", "postgres.autovacuum", "postgres.dead-tuples"} {
		expect(t, fs, id, table, doctor.OK)
	}
	for _, id := range []string{"postgres.stuck-processing", "postgres.oldest-ready", "postgres.max-attempts"} {
		expect(t, fs, id, "billing", doctor.OK)
	}
	expect(t, fs, "clock.skew", "", doctor.OK)
	expect(t, fs, sdk.ConflictMaxAttemptsOverCap, "", doctor.OK)
}

func TestPostgresMisconfigured(t *testing.T) {
	u, pool, schema := pgURL(t, url.Values{"lease": {"100ms"}, "max_attempts": {"3"}})
	b := open(t, u)
	ctx := testCtx(t)
	table := schema + ".jobs"
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()
	for _, stmt := range []string{
		`DROP INDEX ` + pgx.Identifier{schema, "jobs_claim_idx"}.Sanitize(),
		`ALTER TABLE ` + qt + ` SET (autovacuum_enabled = false)`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	// stuck: claimed and never settled, its 100ms lease long gone.
	publish(t, b, "stuck", 1)
	if ds, err := b.Receive(ctx, "stuck", 1); err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	// waiting: a ready job due an hour ago; published with max_attempts 3.
	publish(t, b, "waiting", 1)
	if _, err := pool.Exec(ctx, `UPDATE `+qt+` SET available_at = now() - interval '1 hour' WHERE queue = 'waiting'`); err != nil {
		t.Fatal(err)
	}
	// bloat: rows deleted with autovacuum off.
	publish(t, b, "bloat", 50)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{`DELETE FROM ` + qt + ` WHERE queue = 'bloat'`, `SELECT pg_stat_force_next_flush()`, `SELECT 1`} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	conn.Release()
	time.Sleep(300 * time.Millisecond) // past the lease of "stuck", and one more lease

	opts := doctor.Options{DeadTuples: 10, Now: func() time.Time { return time.Now().Add(-time.Minute) }}
	var fs []doctor.Finding
	for {
		fs, err = doctor.Run(ctx, b, opts)
		if err != nil {
			t.Fatal(err)
		}
		if f := find(fs, "postgres.dead-tuples", table); len(f) == 1 && f[0].Severity == doctor.Warn {
			break
		}
		select { // the statistics reach pg_stat_user_tables within about a second
		case <-ctx.Done():
			t.Fatalf("dead tuples never reported: %v", find(fs, "postgres.dead-tuples", table))
		case <-time.After(200 * time.Millisecond):
		}
	}
	expect(t, fs, "postgres.indexes", table, doctor.Error)
	expect(t, fs, "postgres.autovacuum", table, doctor.Error)
	expect(t, fs, "postgres.stuck-processing", "stuck", doctor.Warn)
	expect(t, fs, "postgres.oldest-ready", "waiting", doctor.Warn)
	expect(t, fs, "postgres.max-attempts", "waiting", doctor.Error)
	expect(t, fs, "clock.skew", "", doctor.Error)
	expect(t, fs, sdk.ConflictMaxAttemptsOverCap, "", doctor.Warn) // Worker MaxAttempts 5 > the broker's 3
	if doctor.Worst(fs) != doctor.Error || fs[0].Severity != doctor.Error {
		t.Errorf("findings not sorted worst first: %s", ids(fs))
	}

	if _, err := pool.Exec(ctx, `DROP TABLE `+qt+` CASCADE`); err != nil {
		t.Fatal(err)
	}
	fs, err = doctor.Postgres(ctx, pool, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "postgres.table-missing", table, doctor.Error)
}

// TestDrainOverGracePeriod: berth's defaults drain within Kubernetes' 30 s;
// a 40 s DrainTimeout does not.
func TestDrainOverGracePeriod(t *testing.T) {
	u, _, _ := pgURL(t, nil)
	b := open(t, u)
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "worker.drain-over-grace-period", "", doctor.OK)
	fs, err = doctor.Run(testCtx(t), b, doctor.Options{DrainTimeout: 40 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "worker.drain-over-grace-period", "", doctor.Warn)
	fs, err = doctor.Run(testCtx(t), b, doctor.Options{DrainTimeout: 40 * time.Second, GracePeriod: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "worker.drain-over-grace-period", "", doctor.OK)
}

// TestPostgresQueueUnknown: a queue named to doctor with no row in any
// status is flagged — Warn when a queue with rows is a few edits away (a
// misspelt name a Worker would poll forever), Info when nothing is near (a
// queue nothing has published to yet looks the same) — while a queue whose
// only rows are dead letters is idle, OK.
func TestPostgresQueueUnknown(t *testing.T) {
	u, _, _ := pgURL(t, nil)
	b := open(t, u)
	ctx := testCtx(t)
	publish(t, b, "billing", 2)
	publish(t, b, "emails", 1)
	ds, err := b.Receive(ctx, "emails", 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	if err := ds[0].DeadLetter(ctx, errors.New("test: dead-lettered")); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{"biling", "reports", "emails", "billing"}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "postgres.queue-unknown", "biling", doctor.Warn)
	if f := find(fs, "postgres.queue-unknown", "biling"); !strings.Contains(f[0].Summary, `"billing"`) {
		t.Errorf("the likely misspelling is not named: %+v", f[0])
	}
	expect(t, fs, "postgres.queue-unknown", "reports", doctor.Info)
	if f := find(fs, "postgres.queue-unknown", "reports"); !strings.Contains(f[0].Evidence, `"billing", "emails"`) {
		t.Errorf("the queues with rows are not listed: %+v", f[0])
	}
	expect(t, fs, "postgres.oldest-ready", "emails", doctor.OK)
	expect(t, fs, "postgres.oldest-ready", "billing", doctor.OK)
	for _, q := range []string{"emails", "billing"} {
		if f := find(fs, "postgres.queue-unknown", q); len(f) != 0 {
			t.Errorf("queue %s has rows, reported unknown: %+v", q, f)
		}
	}
}

// TestPostgresDeclaredQueueKnown: a queue declared with DeclareQueue (a row
// of <schema>.queues, which Stats counts as an existing, empty queue) with
// no job yet is not postgres.queue-unknown, even one edit away from a queue
// with rows: the operator named it. It was reported "no job of this queue
// was ever stored: a misspelt name?", Warn.
func TestPostgresDeclaredQueueKnown(t *testing.T) {
	u, _, _ := pgURL(t, nil)
	b := open(t, u)
	ctx := testCtx(t)
	publish(t, b, "billing", 1)
	d, ok := b.(sdk.QueueDeclarer)
	if !ok {
		t.Fatalf("%T is not a QueueDeclarer", b)
	}
	for _, q := range []string{"billings", "reports"} {
		if err := d.DeclareQueue(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := b.(sdk.Inspector).Stats(ctx, "billings"); err != nil || st.Ready != 0 {
		t.Fatalf("Stats of the declared queue: %+v, %v; want it known and empty", st, err)
	}
	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{"billings", "reports", "billing", "biling"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"billings", "reports"} {
		if f := find(fs, "postgres.queue-unknown", q); len(f) != 0 {
			t.Errorf("declared queue %s reported unknown: %+v", q, f)
		}
		expect(t, fs, "postgres.oldest-ready", q, doctor.OK)
	}
	expect(t, fs, "postgres.queue-unknown", "biling", doctor.Warn)
}
