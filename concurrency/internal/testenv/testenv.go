// Package testenv gives the concurrency tests a Redis client with a unique
// key prefix, cleaned up when the test ends (PostgreSQL schemas come from
// package berthtest/pgtest). Endpoints come from package integration.
package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/integration"
	"github.com/redis/go-redis/v9"
)

// Suffix returns a random lowercase hex string, for unique names.
func Suffix() string { return pgtest.Suffix() }

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
