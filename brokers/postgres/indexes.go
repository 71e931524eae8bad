package postgres

import (
	"regexp"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/internal/pgindex"
)

// Index is one index [SchemaSQL] creates on the jobs table, as schema.sql
// defines it. schema.sql is its only definition: [Indexes] reads it from
// there, so that what berth doctor expects (postgres.indexes) is what
// [Broker.Migrate] creates.
type Index struct {
	// Name is the index's name (in the jobs table's schema).
	Name string
	// Unique is true for a UNIQUE index.
	Unique bool
	// Def is its definition from USING on, as PostgreSQL writes it back
	// (pg_get_indexdef): method, columns, predicate. schema.sql writes each
	// index so.
	Def string
}

// indexRE matches an index statement of schema.sql: columns, then the
// predicate on one line.
var indexRE = regexp.MustCompile(`CREATE (UNIQUE )?INDEX IF NOT EXISTS (\w+) ON "berth"\.jobs \(([^;]*?)\)(?:\s+WHERE ([^;\n]*))?;`)

// jobIndexes are the indexes of schema.sql, in its order.
var jobIndexes = parseIndexes(schemaSQL)

// parseIndexes returns the indexes ddl (schema.sql) creates on the jobs
// table.
func parseIndexes(ddl string) []Index {
	var out []Index
	for _, m := range indexRE.FindAllStringSubmatch(ddl, -1) {
		def := "btree (" + m[3] + ")"
		if m[4] != "" {
			def += " WHERE " + m[4]
		}
		out = append(out, Index{Name: m[2], Unique: m[1] != "", Def: def})
	}
	return out
}

// Indexes returns the indexes [SchemaSQL] creates on the jobs table, in its
// order.
func Indexes() []Index { return slices.Clone(jobIndexes) }

// Matches reports whether def, an index definition as pg_get_indexdef
// writes it, is ix: UNIQUE or not as ix is, with the same method, columns
// (their order, operator classes, collations and sort order), included
// columns and predicate; storage parameters (WITH (fillfactor=...)) are not
// compared. An index made by hand under ix's name, or by an earlier release
// with other columns, does not match: CREATE INDEX IF NOT EXISTS
// ([Broker.Migrate]) keeps it. Schema names are validated identifiers,
// without spaces: the first " USING " ends the table's name.
func (ix Index) Matches(def string) bool { return pgindex.Matches(def, ix.Unique, ix.Def) }

// Create returns the statement that creates ix on schema's jobs table,
// CONCURRENTLY (run it outside a transaction: a plain CREATE INDEX blocks
// writes to the table while it builds) and IF NOT EXISTS.
func (ix Index) Create(schema string) string { return ix.create(schema, ix.Name) }

// create is [Index.Create] under name.
func (ix Index) create(schema, name string) string {
	unique := ""
	if ix.Unique {
		unique = "UNIQUE "
	}
	return "CREATE " + unique + "INDEX CONCURRENTLY IF NOT EXISTS " + quoteIdent(name) + " ON " +
		pgx.Identifier{schema, "jobs"}.Sanitize() + " USING " + ix.Def
}

// Replace returns the statements that replace a valid index of ix's name
// on schema's jobs table that does not match ix, each to run on its own,
// outside a transaction: ix built CONCURRENTLY under the name with "_new"
// (dropped first, should a failed attempt have left it), then the old
// index dropped CONCURRENTLY and the new one renamed. The old index serves
// the queries it can until the new one is built; dropped first, as by
// [Index.Drop] then [Index.Create], every claim would scan the whole table
// (jobs_claim_idx), or every deduplicated enqueue fail (jobs_dedupe_idx),
// for as long as the build takes.
func (ix Index) Replace(schema string) []string {
	return pgindex.Replace(schema, ix.Name, func(name string) string { return ix.create(schema, name) })
}

// Drop returns the statement that drops ix from schema (DROP INDEX
// CONCURRENTLY IF EXISTS), to run before [Index.Create] when the index is
// invalid (one that does not match: [Index.Replace]).
func (ix Index) Drop(schema string) string { return pgindex.Drop(schema, ix.Name) }
