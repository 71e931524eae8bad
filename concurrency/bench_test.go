package concurrency_test

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/internal/testenv"
	"github.com/berthq/berth/concurrency/optimistic"
	"github.com/berthq/berth/concurrency/redislock"
)

// BenchmarkRedisLock compares redislock's Obtain + Release (two Lua scripts:
// SET NX PX with a fencing INCR, and compare-and-delete) with go-redis
// issuing a raw SET NX PX and DEL, on one resource, one goroutine.
func BenchmarkRedisLock(b *testing.B) {
	rdb, prefix := testenv.Redis(b)
	ctx := context.Background()
	c, err := redislock.New(rdb, redislock.Options{Prefix: prefix, TTL: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("berth", func(b *testing.B) {
		for b.Loop() {
			l, err := c.Obtain(ctx, "bench")
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "locks/s")
	})
	b.Run("raw", func(b *testing.B) {
		key := prefix + "raw"
		for b.Loop() {
			ok, err := rdb.SetNX(ctx, key, "owner", 10*time.Second).Result()
			if err != nil || !ok {
				b.Fatalf("SET NX: %v %v", ok, err)
			}
			if err := rdb.Del(ctx, key).Err(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "locks/s")
	})
}

// BenchmarkUpdate compares optimistic.Table.Update (versioned, RETURNING the
// new version) with a plain UPDATE of the same column, one row, one
// goroutine, autocommit. synchronous_commit is off on the benchmark's one
// connection so that the figures measure the statements, not the shared
// disk's fsync.
func BenchmarkUpdate(b *testing.B) {
	pool, _ := pgtest.Schema(b, 1)
	pgtest.Exec(b, pool,
		`SET synchronous_commit = off`,
		`CREATE TABLE bench (id bigint PRIMARY KEY, n bigint NOT NULL, version bigint NOT NULL DEFAULT 1)`,
		`INSERT INTO bench (id, n) VALUES (1, 0), (2, 0)`)
	ctx := context.Background()
	tbl, err := optimistic.New(optimistic.Options{Table: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("optimistic", func(b *testing.B) {
		v, err := tbl.Get(ctx, pool, 1, nil)
		if err != nil {
			b.Fatal(err)
		}
		i := int64(0)
		for b.Loop() {
			i++
			if v, err = tbl.Update(ctx, pool, 1, v, map[string]any{"n": i}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "updates/s")
	})
	b.Run("plain", func(b *testing.B) {
		i := int64(0)
		for b.Loop() {
			i++
			if _, err := pool.Exec(ctx, "UPDATE bench SET n = $2 WHERE id = $1", 2, i); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "updates/s")
	})
}
