// Package demotest checks that an example's demo cleans up after itself when
// a signal stops it: the example's test re-runs its own binary as the demo,
// waits for the demo's schema to appear, sends the signal, and checks that
// the demo ended on its own (exit status 1, saying why) with its schema
// dropped.
package demotest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the check needs of a connection or pool to the demo's
// database: a *pgx.Conn or a *pgxpool.Pool.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SignalDropsSchema starts cmd, the demo (the test binary re-run as it: the
// caller sets its arguments and environment), waits until a schema whose
// name matches pattern (a PostgreSQL regular expression) and was not in db
// before appears, sends sig, and fails t unless the demo then ends with exit
// status 1 and want in its standard error (it stopped itself, rather than
// being killed by the signal) and the schema is gone. A schema left behind
// is dropped. ctx bounds the whole check.
func SignalDropsSchema(ctx context.Context, t testing.TB, db DB, pattern string, cmd *exec.Cmd, sig os.Signal, want string) {
	t.Helper()
	schemas := func() map[string]bool {
		t.Helper()
		rows, err := db.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname ~ $1`, pattern)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		m := make(map[string]bool, len(names))
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	before := schemas()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	kill := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	var mine string
	for mine == "" {
		for n := range schemas() {
			if !before[n] {
				mine = n
			}
		}
		if mine != "" {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the demo ended before its schema appeared: %v\n%s", err, stderr.String())
		case <-ctx.Done():
			kill()
			t.Fatalf("no schema matching %s appeared", pattern)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := cmd.Process.Signal(sig); err != nil {
		kill()
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-exited:
	case <-ctx.Done():
		kill()
		t.Fatalf("the demo did not end after %v\n%s", sig, stderr.String())
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(stderr.String(), want) {
		t.Errorf("after %v the demo ended with %v, want exit status 1 saying %q (not killed by the signal)\n%s", sig, err, want, stderr.String())
	}
	if schemas()[mine] {
		_, _ = db.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{mine}.Sanitize()+" CASCADE")
		t.Errorf("schema %s left behind after %v", mine, sig)
	}
}
