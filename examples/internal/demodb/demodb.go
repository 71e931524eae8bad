// Package demodb gives the example programs a PostgreSQL schema of their
// own: created with a random name, used as the pool's search_path, dropped
// when the demo ends. (Their tests use berthtest/pgtest instead.)
package demodb

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Open creates a schema named prefix_<random> in the database at dsn and
// returns a pool whose search_path is that schema, the schema's name, and a
// function that closes the pool and drops the schema.
func Open(ctx context.Context, dsn, prefix string) (*pgxpool.Pool, string, func(), error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, "", nil, err
	}
	schema := prefix + "_" + hex.EncodeToString(b[:])
	quoted := pgx.Identifier{schema}.Sanitize()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, "", nil, err
	}
	drop := func() {
		ctx := context.WithoutCancel(ctx)
		_, _ = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+quoted+" CASCADE")
		_ = admin.Close(ctx)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+quoted); err != nil {
		drop()
		return nil, "", nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	return pool, schema, func() { pool.Close(); drop() }, nil
}
