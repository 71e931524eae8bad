package doctor_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/idempotency/redisstore"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// resultsTable returns a migrated result store in a fresh schema, a guard on
// it with retention, and the table's name, with one job completed.
func resultsTable(t *testing.T, pool *pgxpool.Pool, retention time.Duration, cache idempotency.Cache) string {
	t.Helper()
	ctx := testCtx(t)
	schema := "doctor_" + suffix()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	store, err := pgstore.New(pool, pgstore.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(idempotency.Options{Store: store, Retention: retention, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	h := sdk.Chain(sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), g.Middleware())
	res := berthtest.Work(t, h, &sdk.Message{Type: "doctor.test", IdempotencyKey: "charge:order_" + suffix() + ":v1"})
	if !res.Acked() {
		t.Fatalf("job not acked: %+v", res)
	}
	return schema + ".job_results"
}

func pgPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(testCtx(t), postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestIdempotencyDefaultsPass(t *testing.T) {
	pool := pgPool(t)
	table := resultsTable(t, pool, 0, nil)
	fs, err := doctor.Idempotency(testCtx(t), pool, table, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clean(t, fs)
	expect(t, fs, "idempotency.retention", table, doctor.OK)
	expect(t, fs, "idempotency.claims-stuck", table, doctor.OK)

	fs, err = doctor.Idempotency(testCtx(t), pool, "public.doctor_no_such_table", doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "idempotency.results-missing", "public.doctor_no_such_table", doctor.Info)
}

func TestIdempotencyMisconfigured(t *testing.T) {
	pool := pgPool(t)
	table := resultsTable(t, pool, time.Hour, nil) // kept an hour; a job may come back for days
	qt := pgx.Identifier{table[:len(table)-len(".job_results")], "job_results"}.Sanitize()
	// a lease-mode claim whose worker died an hour ago, and whose job never came back
	if _, err := pool.Exec(testCtx(t), `INSERT INTO `+qt+` (idempotency_key, status, owner_token, locked_until, expires_at)
		VALUES ('charge:order_lost:v1', 'in_progress', 'w1', now() - interval '1 hour', now() + interval '7 days')`); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Idempotency(testCtx(t), pool, table, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "idempotency.retention", table, doctor.Error)
	expect(t, fs, "idempotency.claims-stuck", table, doctor.Warn)
	// the window is the operator's to give: an hour's queue retention fits
	fs, err = doctor.Idempotency(testCtx(t), pool, table, doctor.Options{RedeliveryWindow: 30 * time.Minute, MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "idempotency.retention", table, doctor.OK)
}

func TestDedupeTTL(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: integration.RedisAddr(t)})
	defer rdb.Close()
	ctx := testCtx(t)
	prefix := "berth:doctor:" + suffix() + ":"
	t.Cleanup(func() {
		keys, _ := rdb.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			rdb.Del(context.Background(), keys...)
		}
	})
	// The guard remembers keys for its default Retention (7 days). The store's
	// Timeout is seconds, not its default 100 ms, and the client has dialled
	// first: a write that times out is only logged (the job still acks),
	// leaving no key to find on a loaded machine.
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	cache, err := redisstore.New(rdb, redisstore.Options{Prefix: prefix, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	pool := pgPool(t)
	resultsTable(t, pool, 0, cache)
	fs, err := doctor.Dedupe(ctx, rdb, prefix, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "idempotency.dedupe-ttl", prefix+"*", doctor.OK)

	// a cache kept an hour: shorter than the window, reported, not an error
	if err := rdb.Set(ctx, prefix+"b", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	short := "berth:doctor:" + suffix() + ":"
	t.Cleanup(func() { rdb.Del(context.Background(), short+"a") })
	if err := rdb.Set(ctx, short+"a", "x", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	fs, err = doctor.Dedupe(ctx, rdb, short, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "idempotency.dedupe-ttl", short+"*", doctor.Info)
	// a key without a TTL: the cache grows forever
	fs, err = doctor.Dedupe(ctx, rdb, prefix, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "idempotency.dedupe-ttl", prefix+"*", doctor.Warn)
}
