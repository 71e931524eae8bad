package main

import (
	"context"
	"strings"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/pause"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestQueueVerbsCreateNoSchema: "queue pause -schema WRONG" created the
// schema WRONG and a pause table in it, which no Worker reads: the pause
// was reported done and paused nothing. A schema that does not exist is now
// a named thing not found (exit 3) for pause, resume and paused, and is not
// created; a schema that exists without the pause table is an error for
// resume and paused (nothing was ever paused there), while the first pause
// in it creates the table, as before.
func TestQueueVerbsCreateNoSchema(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	ctx := context.Background()
	pool, schema, wrong, exists := schemaAndWrong(t)
	for _, verb := range []string{"pause", "resume", "paused"} {
		args := []string{"queue", verb, "-db", dsn, "-schema", wrong}
		if verb != "paused" {
			args = append(args, "emails")
		}
		r := cliDB(t, "", false, args...)
		if r.code != exitNotFound || !strings.Contains(r.err, `schema "`+wrong+`" does not exist`) || exists(wrong) {
			t.Errorf("queue %s -schema %s: exit %d, want %d, the schema named and not created (created: %v):\n%s%s", verb, wrong, r.code, exitNotFound, exists(wrong), r.out, r.err)
		}
	}
	// The schema exists, the table not yet: resume and paused say so.
	for _, verb := range []string{"resume", "paused"} {
		args := []string{"queue", verb, "-db", dsn, "-schema", schema}
		if verb != "paused" {
			args = append(args, "emails")
		}
		r := cliDB(t, "", false, args...)
		if r.code != exitNotFound || !strings.Contains(r.err, "no pause table") {
			t.Errorf("queue %s, no table: exit %d, want %d and \"no pause table\":\n%s%s", verb, r.code, exitNotFound, r.out, r.err)
		}
	}
	var table bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, schema+".paused_queues").Scan(&table); err != nil || table {
		t.Fatalf("pause table created by resume or paused: %v %v", table, err)
	}
	// The first pause in it creates the table.
	if r := cliDB(t, "", false, "queue", "pause", "emails", "-db", dsn, "-schema", schema); r.code != exitOK || !strings.Contains(r.out, "emails paused") {
		t.Fatalf("first pause: exit %d:\n%s%s", r.code, r.out, r.err)
	}
	s, err := pause.NewPG(pool, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if ps, err := s.Paused(ctx); err != nil || len(ps) != 1 || ps[0].Queue != "emails" {
		t.Fatalf("paused: %+v %v", ps, err)
	}
}

// schemaAndWrong returns a schema of the test database (empty, dropped
// when the test ends), the name of one that does not exist (dropped too,
// should a defect create it), and a function that reports whether a schema
// exists.
func schemaAndWrong(t *testing.T) (pool *pgxpool.Pool, schema, wrong string, exists func(string) bool) {
	t.Helper()
	pool, schema = pgtest.Schema(t, 0)
	wrong = schema + "_wrong"
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+wrong+` CASCADE`) })
	exists = func(name string) bool {
		t.Helper()
		var ok bool
		if err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	return pool, schema, wrong, exists
}
