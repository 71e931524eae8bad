// Package pgschema serialises the migrations of berth's PostgreSQL parts
// that share a schema.
//
// The broker, the idempotency store, the ledger, the outbox and the pause
// table each create their schema ("berth" or "public" by default) with
// CREATE SCHEMA IF NOT EXISTS, which is not safe against another session
// creating the same schema meanwhile: it fails with a unique violation
// (SQLSTATE 23505). Each part's own advisory lock serialises its own runs
// only, so services that start together on a new database, running
// different parts' migrations, failed at random. Every part's Migrate takes
// [Lock] first, then its own lock (kept, so that a process of an earlier
// version, which takes only its own, still excludes this one): always in
// that order, so two migrations cannot wait for each other.
package pgschema

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs a statement: a pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Lock takes, in tx, the transaction-scoped advisory lock of the migrations
// of schema (its name as the part's options give it), held until tx ends.
func Lock(ctx context.Context, tx Execer, schema string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "berth.schema."+schema)
	return err
}
