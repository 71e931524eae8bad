package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/idempotency/redisstore"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// noMaint turns off go-redis maintenance notifications, whose circuit
// breaker starts a goroutine that Close does not stop when the server is
// unreachable.
func noMaint() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

func randSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newCache returns a cache under a prefix of its own; its keys are deleted
// at the end.
func newCache(t *testing.T) (*redisstore.Cache, *redis.Client) {
	rdb := redis.NewClient(&redis.Options{Addr: integration.RedisAddr(t), MaintNotificationsConfig: noMaint()})
	prefix := "berth:test:idem:" + randSuffix() + ":"
	c, err := redisstore.New(rdb, redisstore.Options{Prefix: prefix, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		deletePrefix(t, rdb, prefix)
		_ = rdb.Close()
	})
	return c, rdb
}

// deletePrefix deletes this test's keys: what "flushing Redis" means on a
// shared server.
func deletePrefix(t *testing.T, rdb *redis.Client, prefix string) int {
	ctx := context.Background()
	n := 0
	iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		if err := rdb.Del(ctx, iter.Val()).Err(); err != nil {
			t.Error(err)
		}
		n++
	}
	if err := iter.Err(); err != nil {
		t.Error(err)
	}
	return n
}

func newPGStore(t *testing.T) (*pgstore.Store, *pgxpool.Pool, string) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	schema := "berth_idem_" + randSuffix()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	s, err := pgstore.New(pool, pgstore.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return s, pool, effects
}

func TestLookupRemember(t *testing.T) {
	c, _ := newCache(t)
	ctx := context.Background()
	if _, found, err := c.Lookup(ctx, "k"); found || err != nil {
		t.Fatalf("Lookup on empty = %v, %v", found, err)
	}
	if err := c.Remember(ctx, "k", "fp1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.Remember(ctx, "k", "fp2", time.Minute); err != nil { // NX: the first stays
		t.Fatal(err)
	}
	fp, found, err := c.Lookup(ctx, "k")
	if fp != "fp1" || !found || err != nil {
		t.Fatalf("Lookup = %q, %v, %v; want fp1", fp, found, err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := redisstore.New(nil, redisstore.Options{}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("nil client: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{MaintNotificationsConfig: noMaint()})
	defer rdb.Close()
	if _, err := redisstore.New(rdb, redisstore.Options{Timeout: -1}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("negative timeout: %v", err)
	}
}

// The cache is written only after success: a failed attempt leaves no hint
// that would suppress its retry.
func TestNotRememberedBeforeSuccess(t *testing.T) {
	c, _ := newCache(t)
	store, _, _ := newPGStore(t)
	g, err := idempotency.New(idempotency.Options{Store: store, Cache: c})
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "charge:order_1:v1", JobType: "billing.charge", Fingerprint: "fp"}
	fail := errors.New("gateway timeout")
	if _, err := g.Do(context.Background(), op, func(context.Context) error { return fail }); !errors.Is(err, fail) {
		t.Fatal(err)
	}
	if _, found, _ := c.Lookup(context.Background(), op.Key); found {
		t.Fatal("cache remembered a failed attempt")
	}
	ran, err := g.Do(context.Background(), op, func(context.Context) error { return nil })
	if !ran || err != nil {
		t.Fatalf("retry: ran=%v err=%v", ran, err)
	}
	if fp, found, _ := c.Lookup(context.Background(), op.Key); !found || fp != "fp" {
		t.Fatal("cache not written after success")
	}
}

// Redis flushed (this test's prefix deleted) in the middle of a run of
// concurrent duplicate deliveries: still no effect twice, because the durable
// store is checked before every handler run.
func TestRedisFlushedMidRun(t *testing.T) {
	c, rdb := newCache(t)
	store, pool, effects := newPGStore(t)
	var stats idempotency.Stats
	g, err := idempotency.New(idempotency.Options{Store: store, Cache: c, Stats: &stats, InProgressDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const keys = 40
	op := func(i int) idempotency.Operation {
		return idempotency.Operation{Key: fmt.Sprintf("charge:order_%d:v1", i), JobType: "billing.charge", Fingerprint: fmt.Sprintf("fp%d", i)}
	}
	effect := func(ctx context.Context) error {
		key, _ := idempotency.KeyFrom(ctx)
		tx, _ := pgstore.TxFrom(ctx)
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (key) VALUES ($1)`, key)
		return err
	}
	// deliver runs one delivery to completion, retrying while in progress.
	deliver := func(i int) error {
		for {
			_, err := g.Do(ctx, op(i), effect)
			if !errors.Is(err, idempotency.ErrInProgress) {
				return err
			}
		}
	}
	// First half: every key once, then once more (cache hits).
	for i := range keys / 2 {
		for range 2 {
			if err := deliver(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	if s := stats.Snapshot(); s.CacheHits != keys/2 {
		t.Fatalf("cache hits before the flush = %d, want %d", s.CacheHits, keys/2)
	}
	// Then 8 workers deliver every key 4 times while the prefix is flushed.
	var (
		wg      sync.WaitGroup
		next    atomic.Int32
		flushed atomic.Bool
	)
	work := make([]int, 0, keys*4)
	for r := range 4 {
		for i := range keys {
			work = append(work, (i+r*7)%keys)
		}
	}
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j := int(next.Add(1)) - 1
				if j >= len(work) {
					return
				}
				if j == len(work)/2 && flushed.CompareAndSwap(false, true) {
					if deletePrefix(t, rdb, c.Prefix()) == 0 {
						t.Error("nothing to flush: the cache was not in use")
					}
				}
				if err := deliver(work[j]); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	rows, err := pool.Query(ctx, `SELECT key, count(*) FROM `+effects+` GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		counts[k] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if n := counts[op(i).Key]; n != 1 {
			t.Errorf("%s applied %d times, want 1", op(i).Key, n)
		}
	}
	s := stats.Snapshot()
	if !flushed.Load() || s.Executed != keys {
		t.Fatalf("flushed=%v stats=%+v", flushed.Load(), s)
	}
}

// An unreachable Redis only costs store lookups.
func TestUnreachableRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond, MaintNotificationsConfig: noMaint()})
	defer rdb.Close()
	c, err := redisstore.New(rdb, redisstore.Options{Prefix: "berth:test:unreachable:"})
	if err != nil {
		t.Fatal(err)
	}
	store, _, _ := newPGStore(t)
	var stats idempotency.Stats
	g, err := idempotency.New(idempotency.Options{Store: store, Cache: c, Stats: &stats})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	op := idempotency.Operation{Key: "k", JobType: "t", Fingerprint: "fp"}
	for range 3 {
		if _, err := g.Do(context.Background(), op, func(context.Context) error { runs.Add(1); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if s := stats.Snapshot(); runs.Load() != 1 || s.CacheErrors == 0 || s.DuplicatesSuppressed != 2 {
		t.Fatalf("runs=%d stats=%+v", runs.Load(), s)
	}
}

// A key whose completion the cache remembers, reused for a different
// payload, is still a permanent conflict: the cache answers only for the
// same fingerprint, and never turns a conflict into a suppressed duplicate.
func TestCachedKeyWithOtherPayloadConflicts(t *testing.T) {
	c, _ := newCache(t)
	store, _, _ := newPGStore(t)
	g, err := idempotency.New(idempotency.Options{Store: store, Cache: c})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	op := idempotency.Operation{Key: "charge:order_1:v1", JobType: "billing.charge", Fingerprint: "fp-4200"}
	if ran, err := g.Do(ctx, op, func(context.Context) error { return nil }); !ran || err != nil {
		t.Fatalf("first: ran=%v err=%v", ran, err)
	}
	if fp, found, err := c.Lookup(ctx, op.Key); !found || fp != op.Fingerprint || err != nil {
		t.Fatalf("cache after success = %q, %v, %v", fp, found, err)
	}
	other := op
	other.Fingerprint = "fp-9900"
	ran, err := g.Do(ctx, other, func(context.Context) error { return nil })
	if ran || !errors.Is(err, idempotency.ErrKeyConflict) || sdk.Classify(err) != sdk.ClassPermanent {
		t.Fatalf("other payload: ran=%v err=%v; want a permanent ErrKeyConflict", ran, err)
	}
}
