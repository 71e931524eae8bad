package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/integration"
)

// internalBroker returns a migrated Broker with opts on a schema of its own
// (opts.Schema is set), and its pool; both are closed and the schema is
// dropped when the test ends.
func internalBroker(t *testing.T, ctx context.Context, opts Options) (*Broker, *pgxpool.Pool) {
	t.Helper()
	pool, err := pgxpool.New(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	p := make([]byte, 6)
	_, _ = rand.Read(p)
	opts.Schema = "berth_test_" + hex.EncodeToString(p)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+opts.Schema+` CASCADE`) })
	b, err := New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return b, pool
}
