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
// that order, so two migrations cannot wait for each other. Each then asks
// [Present] whether what it makes is there already, and runs no DDL (so
// takes no lock on its tables) when it is.
package pgschema

import (
	"context"

	"github.com/jackc/pgx/v5"
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

// Querier runs a query returning one row: a pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Present reports whether schema holds a relation (table, index, sequence)
// of every one of names. A part's Migrate asks it before running its DDL
// and runs none when all are there: CREATE INDEX IF NOT EXISTS takes its
// SHARE lock on the table before it finds the index (ALTER TABLE ... ADD
// COLUMN IF NOT EXISTS its ACCESS EXCLUSIVE lock before it finds the
// column), so a process starting while the table is written waits for
// every transaction that wrote to it, and every write queues behind it.
// names are as the catalog holds them (unquoted, case as created).
func Present(ctx context.Context, q Querier, schema string, names ...string) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(DISTINCT c.relname) FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = ANY($2::text[])`, schema, names).Scan(&n)
	if err != nil {
		return false, err
	}
	return n == len(names), nil
}
