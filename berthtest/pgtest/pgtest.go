// Package pgtest gives each test its own PostgreSQL schema: a fresh schema
// in the database that package integration finds, a pool whose connections
// use it as search_path, and the schema dropped when the test ends. Tests
// that create the same tables run in parallel without seeing each other.
//
//	pool, _ := pgtest.Schema(t, 0)
//	pgtest.Exec(t, pool, `CREATE TABLE orders (id text PRIMARY KEY, version bigint NOT NULL)`)
//
// Without a reachable PostgreSQL the test is skipped, or fails under CI=true
// (see package integration).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/integration"
)

// Suffix returns a random lowercase hex string, for unique names.
func Suffix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // the system's random source failed: nothing works
	}
	return hex.EncodeToString(b[:])
}

// Schema creates a schema named "berthtest_<random>" in the database of
// [integration.PostgresDSN], returns a pool of at most maxConns connections
// (0: pgxpool's default) whose search_path is that schema, and the schema's
// name. The pool is closed and the schema dropped at cleanup.
func Schema(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := integration.PostgresDSN(t)
	schema := "berthtest_" + Suffix()
	return Connect(t, dsn, schema, true, maxConns), schema
}

// Connect connects to dsn with search_path set to schema, creating the
// schema (and dropping it at cleanup) when create is true: a second pool on
// a schema that [Schema] made, or a schema on another database.
func Connect(t testing.TB, dsn, schema string, create bool, maxConns int32) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	quoted := pgx.Identifier{schema}.Sanitize()
	if create {
		admin, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("pgtest: connect: %v", err)
		}
		_, err = admin.Exec(ctx, "CREATE SCHEMA "+quoted)
		closeConn(admin) // before Fatalf, which ends the test's goroutine
		if err != nil {
			t.Fatalf("pgtest: create schema: %v", err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Errorf("pgtest: cleanup connect: %v", err)
				return
			}
			defer c.Close(ctx)
			if _, err := c.Exec(ctx, "DROP SCHEMA "+quoted+" CASCADE"); err != nil {
				t.Errorf("pgtest: drop schema: %v", err)
			}
		})
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("pgtest: parse dsn: %v", err)
	}
	// Quoted as CREATE SCHEMA quoted it: search_path is a list of
	// identifiers, so an unquoted name is folded to lower case (and split at
	// a comma) and names another schema.
	cfg.ConnConfig.RuntimeParams["search_path"] = quoted
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(pool.Close) // registered after the drop: runs before it
	return pool
}

// closeConn closes c, bounded on its own: the context of the statement
// that failed may have ended, and the connection must close anyway.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// execTimeout bounds all the statements of one [Exec] call.
var execTimeout = 30 * time.Second

// Exec runs statements on pool and fails the test on the first error. The
// statements run, all together, within 30s: a statement that waits on a
// lock the test holds elsewhere fails the test instead of hanging it. (Not
// under t.Context(): that ends before the test's Cleanup functions run,
// which may call Exec.)
func Exec(t testing.TB, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), execTimeout)
	defer cancel()
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("pgtest: %s: %v", s, err)
		}
	}
}
