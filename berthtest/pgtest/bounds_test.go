package pgtest_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/integration"
)

// fatalT records Fatalf, and stops its caller as Fatalf does, instead of
// failing the real test.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper() {}
func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(fatalPanic{})
}

type fatalPanic struct{}

// fatalMessage runs f as a test would, and returns the message of its
// Fatalf ("" without one). It waits up to a minute (Exec's bound is
// shortened by the tests that hang it), and fails t past that.
func fatalMessage(t *testing.T, f func(tb testing.TB)) string {
	t.Helper()
	ft := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(fatalPanic); !ok {
					panic(r)
				}
			}
		}()
		f(ft)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("still running after a minute")
	}
	return ft.msg
}

// TestExecIsBounded: a statement that does not end (here a sleep; in a
// test, a lock held by another connection) fails the test at Exec's bound.
// Before, Exec ran under context.Background(): it hung the test binary.
func TestExecIsBounded(t *testing.T) {
	pool, _ := pgtest.Schema(t, 1)
	defer pgtest.SetExecTimeout(200 * time.Millisecond)()
	msg := fatalMessage(t, func(tb testing.TB) { pgtest.Exec(tb, pool, `SELECT pg_sleep(3600)`) })
	if !strings.Contains(msg, "pg_sleep") {
		t.Fatalf("Exec of a statement that does not end: Fatalf %q, want one naming it", msg)
	}
}

// TestConnectClosesTheAdminConnection: a CREATE SCHEMA that fails (the
// schema exists) fails the test and closes the connection it ran on.
// Before, Fatalf ended the test with that connection open: a backend held
// until the process exits.
func TestConnectClosesTheAdminConnection(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	_, schema := pgtest.Schema(t, 1)
	app := "pgtest_" + pgtest.Suffix()
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("application_name", app)
		u.RawQuery = q.Encode()
		dsn = u.String()
	} else {
		dsn += " application_name=" + app
	}
	msg := fatalMessage(t, func(tb testing.TB) { pgtest.Connect(tb, dsn, schema, true, 1) })
	if !strings.Contains(msg, "create schema") {
		t.Fatalf("Connect creating an existing schema: Fatalf %q, want the CREATE SCHEMA's error", msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The server drops a closed connection's backend shortly after.
	for n := -1; n != 0; time.Sleep(20 * time.Millisecond) {
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			t.Fatalf("connections of the failed Connect still open (%v)", err)
		}
	}
}
