// Package testenv gives the concurrency tests a PostgreSQL pool confined to a
// fresh schema and a Redis client with a unique key prefix, both cleaned up
// when the test ends. Endpoints come from package integration.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/berthq/berth/integration"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Suffix returns a random lowercase hex string, for unique names.
func Suffix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // the system's random source failed: nothing works
	}
	return hex.EncodeToString(b[:])
}

// Postgres creates a schema named after a random suffix, returns a pool whose
// connections use it as search_path, and drops the schema at cleanup.
func Postgres(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := integration.PostgresDSN(t)
	schema := "conc_" + Suffix()
	return PostgresSchema(t, dsn, schema, true, maxConns), schema
}

// PostgresSchema connects to dsn with search_path set to schema, creating the
// schema (and dropping it at cleanup) when create is true.
func PostgresSchema(t testing.TB, dsn, schema string, create bool, maxConns int32) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	quoted := pgx.Identifier{schema}.Sanitize()
	if create {
		admin, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		if _, err := admin.Exec(ctx, "CREATE SCHEMA "+quoted); err != nil {
			t.Fatalf("create schema: %v", err)
		}
		_ = admin.Close(ctx)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Errorf("cleanup connect: %v", err)
				return
			}
			defer c.Close(ctx)
			if _, err := c.Exec(ctx, "DROP SCHEMA "+quoted+" CASCADE"); err != nil {
				t.Errorf("drop schema: %v", err)
			}
		})
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close) // registered after the drop: runs before it
	return pool
}

// Exec runs statements on pool and fails the test on error.
func Exec(t testing.TB, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// Redis returns a client and a unique key prefix ("berthtest:<suffix>:");
// every key under the prefix is deleted at cleanup.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: integration.RedisAddr(t)})
	prefix := "berthtest:" + Suffix() + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("redis cleanup: %v", err)
		}
		_ = rdb.Close()
	})
	return rdb, prefix
}
