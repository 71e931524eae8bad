package postgres

import (
	"context"
	_ "embed"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/internal/pgschema"
)

// DefaultSchema is the schema the jobs table lives in when Options.Schema is empty.
const DefaultSchema = "berth"

// schemaSQL is the DDL for DefaultSchema, shipped for teams who apply their
// migrations themselves. SchemaSQL renders it for any schema.
//
//go:embed schema.sql
var schemaSQL string

// schemaPlaceholder is the quoted default schema as it appears in schema.sql.
const schemaPlaceholder = `"berth"`

var schemaRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,47}$`)

// ValidateSchema reports whether name can be used as Options.Schema: 1 to 48
// ASCII letters, digits and underscores, not starting with a digit, and not
// starting with "pg_" (reserved by PostgreSQL). The name is always quoted in
// SQL, so it is case-sensitive.
func ValidateSchema(name string) error {
	if !schemaRE.MatchString(name) || strings.HasPrefix(strings.ToLower(name), "pg_") {
		return fmt.Errorf("%w: schema %q must be 1-48 of [A-Za-z0-9_], not starting with a digit or pg_", ErrInvalidSchema, name)
	}
	return nil
}

// SchemaSQL returns the DDL that creates schema and its jobs table with the
// indexes the broker needs, as plain SQL to apply with psql or a migration
// tool. It is what [Broker.Migrate] runs; every statement is idempotent
// (IF NOT EXISTS). The schema name is validated and quoted.
func SchemaSQL(schema string) (string, error) {
	if err := ValidateSchema(schema); err != nil {
		return "", err
	}
	return strings.ReplaceAll(schemaSQL, schemaPlaceholder, quoteIdent(schema)), nil
}

// quoteIdent quotes a validated identifier for SQL.
func quoteIdent(name string) string { return pgx.Identifier{name}.Sanitize() }

// Migrate creates the broker's schema, jobs table and indexes when they do not
// exist. It is idempotent and safe to run from many processes at once: it
// takes a transaction-scoped advisory lock so concurrent runs do not race on
// CREATE ... IF NOT EXISTS. When the tables and every index (by name) are
// there, it runs no DDL, so it takes no lock on the jobs table: a process
// starting during work does not stall the queues behind a writing
// transaction. Teams who manage migrations themselves apply
// [SchemaSQL] instead.
func (b *Broker) Migrate(ctx context.Context) error {
	if b.isClosed() {
		return errClosed("migrate")
	}
	ddl, err := SchemaSQL(b.schema)
	if err != nil {
		return err
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return b.wrap(ctx, "migrate", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := pgschema.Lock(ctx, tx, b.schema); err != nil {
		return b.wrap(ctx, "migrate", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "berth.migrate."+b.schema); err != nil {
		return b.wrap(ctx, "migrate", err)
	}
	// Done already (every process that starts runs Migrate): the DDL is
	// not run again. CREATE INDEX IF NOT EXISTS takes its SHARE lock on
	// the jobs table before it finds the index there: it waits for every
	// transaction that wrote to the table (a PublishTx in a long business
	// transaction), and every claim, ack and publish queues behind it.
	// The DDL is CREATE ... IF NOT EXISTS of these names alone: a later
	// version that alters what exists (a column added) must check for
	// that here too, or it would be skipped on migrated schemas.
	names := []string{"jobs", "queues"}
	for _, ix := range jobIndexes {
		names = append(names, ix.Name)
	}
	done, err := pgschema.Present(ctx, tx, b.schema, names...)
	if err != nil {
		return b.wrap(ctx, "migrate", err)
	}
	if done {
		return nil
	}
	// Simple protocol: the DDL is several statements.
	if _, err := tx.Exec(ctx, ddl, pgx.QueryExecModeSimpleProtocol); err != nil {
		return b.wrap(ctx, "migrate", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return b.wrap(ctx, "migrate", err)
	}
	return nil
}
