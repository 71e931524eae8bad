// Package redisstore is a Redis dedupe cache for the idempotency guard: a
// fast path, never the source of truth. The guard consults it before the
// durable store and writes it (SET NX EX) only after the durable store
// recorded success, so a hit always means the operation completed; a miss, an
// error, an eviction or a flushed Redis only cost a store lookup — never a
// duplicate effect.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix is the key prefix used when Options.Prefix is empty.
const DefaultPrefix = "berth:idem:"

// Options configures a Cache.
type Options struct {
	// Prefix is prepended to every key. Default "berth:idem:". Use one
	// prefix per durable store (per job_results table): a key found under
	// the prefix is taken as completed in the store the guard uses, so two
	// stores (tenants, environments) sharing a Redis and a prefix would skip
	// each other's operations.
	Prefix string
	// Timeout bounds each call so a slow Redis never slows the handler path
	// much. Default 100ms.
	Timeout time.Duration
}

// Cache is an [idempotency.Cache] on Redis. It is safe for concurrent use; it
// does not own the client (closing it is the caller's business).
type Cache struct {
	rdb     redis.Cmdable
	prefix  string
	timeout time.Duration
}

var _ idempotency.Cache = (*Cache)(nil)

// New returns a cache on rdb (a *redis.Client, *redis.ClusterClient, …).
func New(rdb redis.Cmdable, opts Options) (*Cache, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil Redis client", idempotency.ErrInvalidConfig)
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("%w: negative timeout", idempotency.ErrInvalidConfig)
	}
	if opts.Timeout == 0 {
		opts.Timeout = 100 * time.Millisecond
	}
	return &Cache{rdb: rdb, prefix: opts.Prefix, timeout: opts.Timeout}, nil
}

// Prefix returns the key prefix.
func (c *Cache) Prefix() string { return c.prefix }

// Lookup implements [idempotency.Cache] with GET.
func (c *Cache) Lookup(ctx context.Context, key string) (string, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	fp, err := c.rdb.Get(ctx, c.prefix+key).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("redisstore: lookup: %w", err)
	}
	return fp, true, nil
}

// Remember implements [idempotency.Cache] with SET NX EX: the first writer's
// fingerprint stays until ttl (at least one second) passes.
func (c *Cache) Remember(ctx context.Context, key, fingerprint string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if ttl < time.Second {
		ttl = time.Second
	}
	if err := c.rdb.SetNX(ctx, c.prefix+key, fingerprint, ttl).Err(); err != nil {
		return fmt.Errorf("redisstore: remember: %w", err)
	}
	return nil
}
