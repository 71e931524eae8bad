package main

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/pause"
	"github.com/berthq/berth/sdk"
)

// berth queue pause/resume/paused write the pause table that pause.Sync
// reads.
func TestQueuePauseResume(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	ctx := context.Background()
	pool, schema := pgtest.Schema(t, 0)

	r := cliDB(t, "", false, "queue", "pause", "-db", dsn, "-schema", schema, "emails", "reports")
	if r.code != 0 || !strings.Contains(r.out, "emails paused") || !strings.Contains(r.out, "reports paused") {
		t.Fatalf("pause: %+v", r)
	}
	if r = cliDB(t, "", false, "queue", "pause", "-db", dsn, "-schema", schema, "emails"); r.code != 0 || !strings.Contains(r.out, "emails was paused already") {
		t.Fatalf("pause again: %+v", r)
	}
	s, err := pause.NewPG(pool, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := s.Paused(ctx)
	if err != nil || len(ps) != 2 {
		t.Fatalf("table: %+v %v", ps, err)
	}
	r = cliDB(t, "", false, "queue", "paused", "-json", "-db", dsn, "-schema", schema)
	var list jsonPausedList
	if r.code != 0 || json.Unmarshal([]byte(r.out), &list) != nil || len(list.Queues) != 2 || list.Queues[0].Queue != "emails" {
		t.Fatalf("paused -json: %+v (%+v)", r, list)
	}
	if r = cliDB(t, "", false, "queue", "resume", "-db", dsn, "-schema", schema, "emails"); r.code != 0 || !strings.Contains(r.out, "emails resumed") {
		t.Fatalf("resume: %+v", r)
	}
	if r = cliDB(t, "", false, "queue", "resume", "-db", dsn, "-schema", schema, "emails"); r.code != 0 || !strings.Contains(r.out, "emails was not paused") {
		t.Fatalf("resume again: %+v", r)
	}
	if r = cliDB(t, "", false, "queue", "paused", "-db", dsn, "-schema", schema); r.code != 0 || strings.Contains(r.out, "emails") || !strings.Contains(r.out, "reports") {
		t.Fatalf("paused: %+v", r)
	}
	// Untrusted queue names are refused before they reach a terminal or a row.
	if r = cliDB(t, "", false, "queue", "pause", "-db", dsn, "-schema", schema, "bad\x1b[31mname"); r.code == 0 || strings.Contains(r.err, "\x1b") {
		t.Errorf("bad name: %+v", r)
	}
	if r = cliDB(t, "", false, "queue", "pause", "emails"); r.code == 0 || !strings.Contains(r.err, "no database") {
		t.Errorf("without -db: %+v", r)
	}
	if r = cliDB(t, "", false, "queue", "pause", "-db", dsn, "-schema", "x;drop", "emails"); r.code == 0 {
		t.Errorf("bad schema: %+v", r)
	}
}

// TestQueuePauseRefusesABadNameFirst: a queue name that cannot be paused is
// a usage error (exit 2) that changes nothing. Named after a good one, the
// good one was paused first and the command failed with exit 1, a change
// done in part.
func TestQueuePauseRefusesABadNameFirst(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	pool, schema := pgtest.Schema(t, 0)
	r := cliDB(t, "", false, "queue", "pause", "-db", dsn, "-schema", schema, "emails", "bad name")
	if r.code != exitUsage || strings.Contains(r.out, "emails paused") {
		t.Fatalf("pause with a bad name: %+v", r)
	}
	s, err := pause.NewPG(pool, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ps, err := s.Paused(context.Background()); err != nil || len(ps) != 0 {
		t.Fatalf("paused after a refused command: %+v %v", ps, err)
	}
}

// Resume checks its names before any change too: a name PostgreSQL cannot
// store (not UTF-8, or a NUL) is a usage error, and the good queue named
// before it stays paused. Names that merely break today's naming rules are
// not refused, so that queues paused by an older version can be resumed.
func TestQueueResumeRefusesUnstorableNameFirst(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	pool, schema := pgtest.Schema(t, 0)
	s, err := pause.NewPG(pool, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pause(ctx, "emails"); err != nil {
		t.Fatal(err)
	}
	r := cliDB(t, "", false, "queue", "resume", "-db", dsn, "-schema", schema, "emails", "bad\xffname")
	if r.code != exitUsage || strings.Contains(r.out, "emails resumed") {
		t.Fatalf("resume with an unstorable name: %+v", r)
	}
	if ps, err := s.Paused(ctx); err != nil || len(ps) != 1 || ps[0].Queue != "emails" {
		t.Fatalf("paused after a refused resume: %+v %v, want emails still paused", ps, err)
	}
}

// readOnlyDSN is dsn with every transaction read-only, as on a hot-standby
// replica.
func readOnlyDSN(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("default_transaction_read_only", "on")
	u.RawQuery = q.Encode()
	return u.String()
}

// TestPausesReadOnADatabaseThatRefusesChanges: "berth queue paused" and
// "berth ui -read-only" only read the pause table, but created it first
// (CREATE SCHEMA IF NOT EXISTS, which needs write access even when the
// schema exists): on a read-only replica, or with a role that may not create
// schemas, the listing failed and the read-only dashboard did not start.
func TestPausesReadOnADatabaseThatRefusesChanges(t *testing.T) {
	ctx := context.Background()
	pool, schema := pgtest.Schema(t, 0)
	s, err := pause.NewPG(pool, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pause(ctx, "emails"); err != nil {
		t.Fatal(err)
	}
	ro := readOnlyDSN(t, integration.PostgresDSN(t))

	if r := cliDB(t, "", false, "queue", "paused", "-db", ro, "-schema", schema); r.code != exitOK || !strings.Contains(r.out, "emails") {
		t.Fatalf("queue paused on a read-only database: %+v", r)
	}
	// A schema that does not exist: not found (exit 3), and nothing is
	// created.
	none := schema + "_none"
	if r := cliDB(t, "", false, "queue", "paused", "-db", ro, "-schema", none); r.code != exitNotFound || !strings.Contains(r.err, "does not exist") {
		t.Fatalf("queue paused in a schema that does not exist: %+v", r)
	}
	var created bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, none).Scan(&created); err != nil || created {
		t.Fatalf("schema %s created: %v %v", none, created, err)
	}

	b, _ := deadLettered(t, 1)
	e := env{open: func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil }}
	addr, _ := startUI(t, e, "-addr", "127.0.0.1:0", "-url", "mem://", "-read-only", "-db", ro, "-schema", schema)
	if code, page := httpGet(t, "http://"+addr+"/queues/billing", ""); code != 200 || !strings.Contains(page, "billing") {
		t.Fatalf("/queues/billing: %d\n%s", code, page)
	}
}

// TestQueuePauseFailingPartWay: when the pause of a later queue fails after
// earlier ones were paused, the command says what it did and exits 4 (a
// change done in part), not 1 as if nothing had changed.
func TestQueuePauseFailingPartWay(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	ctx := context.Background()
	pool, schema := pgtest.Schema(t, 0)
	s, err := pause.NewPG(pool, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// The database refuses to pause "boom", as a constraint or a lost
	// connection would.
	pgtest.Exec(t, pool,
		`CREATE FUNCTION `+schema+`.refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.queue = 'boom' THEN RAISE EXCEPTION 'refused by policy'; END IF; RETURN NEW; END $$`,
		`CREATE TRIGGER refuse_boom BEFORE INSERT ON `+schema+`.paused_queues FOR EACH ROW EXECUTE FUNCTION `+schema+`.refuse_boom()`)
	r := cliDB(t, "", false, "queue", "pause", "-db", dsn, "-schema", schema, "emails", "boom", "reports")
	if r.code != exitPartial {
		t.Errorf("exit %d, want %d (partial): %+v", r.code, exitPartial, r)
	}
	if !strings.Contains(r.out, "emails paused") || !strings.Contains(r.err, "1 queue(s) before it were done") || !strings.Contains(r.err, "refused by policy") {
		t.Errorf("output does not say what was done: %+v", r)
	}
	ps, err := s.Paused(ctx)
	if err != nil || len(ps) != 1 || ps[0].Queue != "emails" {
		t.Fatalf("paused: %+v %v; want emails only", ps, err)
	}
}
