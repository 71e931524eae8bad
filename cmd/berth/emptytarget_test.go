package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// TestEmptyTargetIsRefused: -url, -db, -table or -schema given an empty
// value (a script's unset variable: berth outbox discard -yes -db
// "$APP_DB", as RUNBOOK.md writes it) was taken as not given, so the
// command went to the default: BERTH_DB (another database, the ledger's),
// BERTH_URL, public.berth_outbox, schema berth. So did a -table whose
// schema or table is empty ("$SCHEMA.outbox" with SCHEMA unset:
// public.outbox; "app." : app.berth_outbox). A discard with -yes deleted the
// parked rows of a table the operator never named. Each is now a usage
// error (exit 2), refused before anything is read or changed; leaving the
// flag out still means its default.
func TestEmptyTargetIsRefused(t *testing.T) {
	ctx := context.Background()
	dsn := integration.PostgresDSN(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("cli_emptytarget_%d", rand.Uint64()%1e12)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	// The outbox of the schema, in the table of the default name.
	box, err := outbox.New(pool, outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := box.Add(ctx, tx, "emails", &sdk.Message{Type: "email.receipt", Body: fmt.Appendf(nil, `{"order":%d}`, i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := box.RelayOnce(ctx, refusing{}, outbox.RelayOptions{MaxAttempts: 1}); err == nil {
		t.Fatal("the relay published to a refusing publisher")
	}
	parked := func() int {
		t.Helper()
		rows, err := box.Parked(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(rows)
	}
	if n := parked(); n != 3 {
		t.Fatalf("%d rows parked, want 3", n)
	}
	environ := map[string]string{"BERTH_DB": dsn, "BERTH_URL": "mem://"}
	cli := func(args ...string) result {
		t.Helper()
		var out, errOut strings.Builder
		code := run(ctx, args, env{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut,
			getenv: func(k string) string { return environ[k] }, open: openURL})
		return result{out.String(), errOut.String(), code}
	}
	table := schema + ".berth_outbox"
	for _, c := range []struct {
		args []string
		flag string
	}{
		// The changes: nothing may be discarded.
		{[]string{"outbox", "discard", "-yes", "-db", "", "-table", table}, "-db"},
		{[]string{"outbox", "discard", "-yes", "-db", dsn, "-table", schema + "."}, "-table"},
		{[]string{"outbox", "requeue", "-yes", "-db", dsn, "-table", ""}, "-table"},
		// The reads: they would read elsewhere (public.outbox, schema berth,
		// the broker of BERTH_URL), and none creates anything.
		{[]string{"outbox", "list", "-db", dsn, "-table", ".berth_outbox"}, "-table"},
		{[]string{"queue", "paused", "-db", dsn, "-schema", ""}, "-schema"},
		{[]string{"jobs", "-db", dsn, "-schema", ""}, "-schema"},
		{[]string{"stats", "-url", ""}, "-url"},
	} {
		r := cli(c.args...)
		if r.code != exitUsage || !strings.Contains(r.err, c.flag) {
			t.Errorf("berth %q: exit %d, want %d naming %s:\n%s%s", c.args, r.code, exitUsage, c.flag, r.out, r.err)
		}
		if n := parked(); n != 3 {
			t.Fatalf("berth %q: %d of the 3 parked rows are left:\n%s%s", c.args, n, r.out, r.err)
		}
	}
	// Left out, each flag keeps its default.
	if r := cli("outbox", "list", "-table", table); r.code != exitOK || !strings.Contains(r.out, "3 parked row(s)") {
		t.Errorf("outbox list with BERTH_DB: exit %d\n%s%s", r.code, r.out, r.err)
	}
	if r := cli("stats"); r.code != exitOK {
		t.Errorf("stats with BERTH_URL: exit %d\n%s%s", r.code, r.out, r.err)
	}
}
