package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" { // re-executed by a fault test; SIGKILLed there
		helperProcess()
	}
	goleak.VerifyTestMain(m)
}

// newPool returns a pool on the test database, tagged with appName (so a
// test can find its connections in pg_stat_activity), closed at cleanup.
func newPool(t testing.TB, appName string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return newPoolWith(t, appName, maxConns, nil)
}

// newPoolWith is newPool whose sessions start with params (run-time
// settings such as lock_timeout or default_transaction_read_only).
func newPoolWith(t testing.TB, appName string, maxConns int32, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// freshSchema returns a new schema name, dropped at cleanup.
func freshSchema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	schema := "berth_test_" + suffix()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// newBroker returns a migrated broker on a fresh schema, closed at cleanup
// (before the schema is dropped and the pool closed).
func newBroker(t testing.TB, pool *pgxpool.Pool, opts postgres.Options) *postgres.Broker {
	t.Helper()
	if opts.Schema == "" {
		opts.Schema = freshSchema(t, pool)
	}
	b, err := postgres.New(pool, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return b
}

func suffix() string {
	p := make([]byte, 6)
	_, _ = rand.Read(p)
	return hex.EncodeToString(p)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
