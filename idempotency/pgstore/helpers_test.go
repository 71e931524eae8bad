package pgstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func randSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newPool opens a pool large enough for eight concurrent transactions plus
// the test's own queries (the default is max(4, GOMAXPROCS)).
func newPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 20
	return pgxpool.NewWithConfig(ctx, cfg)
}

// env is one test's PostgreSQL schema, pool and migrated store, plus an
// effects table the handlers write to.
type env struct {
	dsn    string
	schema string
	pool   *pgxpool.Pool
	store  *pgstore.Store
}

// oneConnStore returns a Store on e's schema through a pool of a single
// connection, and that pool (closed when the test ends): a test takes the
// connection to cut the store off from its worker (a starved pool, an
// outage) while the store's other clients still reach the database.
func oneConnStore(t *testing.T, e *env) (*pgxpool.Pool, *pgstore.Store) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	small, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(small.Close)
	s, err := pgstore.New(small, pgstore.Options{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	return small, s
}

func newEnv(t testing.TB) *env {
	t.Helper()
	dsn := integration.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := newPool(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := "berth_idem_" + randSuffix()
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(cctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("drop schema: %v", err)
		}
		pool.Close()
	})
	store, err := pgstore.New(pool, pgstore.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "effects"}.Sanitize()+` (id bigserial PRIMARY KEY, key text NOT NULL, worker text)`); err != nil {
		t.Fatal(err)
	}
	return &env{dsn: dsn, schema: schema, pool: pool, store: store}
}

func (e *env) effects() string { return pgx.Identifier{e.schema, "effects"}.Sanitize() }

func (e *env) effectCount(t testing.TB, key string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.effects()+` WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// newDelivery returns a recording delivery of m from queue "billing", for
// tests that call a handler directly; tests of what the Worker does with the
// result use berthtest.Work.
func newDelivery(m *sdk.Message) *berthtest.Delivery {
	return berthtest.NewDelivery(m, berthtest.Queue("billing"))
}
