// Package pgindex reads what a PostgreSQL schema holds under the names of
// a table's expected indexes, for the index checks of berth doctor: the
// broker's jobs table (postgres.indexes) and the ledger's (ledger.indexes,
// through pgledger.Store.Indexes). Each index is read with the replacement
// a Replace builds under its name with "_new", what holds either name when
// it is not an index of the table, and whether a CREATE INDEX CONCURRENTLY
// under way builds an invalid one.
package pgindex

import (
	"context"
	"errors"
	"net"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DB is what Read needs of a connection: *pgxpool.Pool, *pgx.Conn and
// pgx.Tx satisfy it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// NewSuffix ends the name a replacement is built under.
const NewSuffix = "_new"

// Rel is what holds one name in the table's schema.
type Rel struct {
	OnTable  bool   // an index of the table; else another relation holds the name
	Valid    bool   // indisvalid
	Def      string // pg_get_indexdef
	Building bool   // a CREATE INDEX CONCURRENTLY under way builds it (an invalid index of the table), or built it since the catalog was read
	Holder   string // !OnTable: what holds the name ("an index of " and its table, "a table", ...), as read
	Free     string // a free name for it: the name with "_old", or "_old2" and on if that is taken
	OID      uint32
}

// Catalog is what Read found.
type Catalog struct {
	// Rels holds each name read that a relation of the schema holds.
	Rels map[string]Rel
	// Hidden: pg_stat_progress_create_index shows a build under way in
	// the database without saying of which index (another role's, to a
	// user without pg_read_all_stats): an invalid index may be that
	// build's.
	Hidden bool
	// Unread: pg_stat_progress_create_index could not be read (its
	// SELECT revoked): whether an invalid index is being built is not
	// known.
	Unread bool
}

// Read returns what the schema of table (quoted, qualified) holds under
// each of names and each with "_new". Builds under way are read after the
// catalog, only when an index is invalid, in a transaction of their own (a
// savepoint when db is a transaction, which the failure would otherwise
// abort): where the progress view answers with an error, the catalog is
// still returned, with Unread. An error is returned when the catalog
// cannot be read, and when the progress view's query ends with ctx or on a
// timeout, as any other query of the check would.
func Read(ctx context.Context, db DB, table string, names []string) (Catalog, error) {
	all := make([]string, 0, 2*len(names))
	all = append(all, names...)
	for _, n := range names {
		all = append(all, n+NewSuffix)
	}
	// Every relation of the schema with one of the names: CREATE INDEX IF
	// NOT EXISTS skips a name another relation holds, as an index a
	// renamed table took along.
	rows, err := db.Query(ctx, `SELECT c.relname, COALESCE(x.indrelid = $1::regclass, false), COALESCE(x.indisvalid, false),
	COALESCE(pg_get_indexdef(x.indexrelid), ''), c.oid,
	CASE WHEN x.indexrelid IS NOT NULL THEN 'an index of ' || COALESCE(quote_ident(t.relname), 'another table')
		ELSE CASE c.relkind WHEN 'r' THEN 'a table' WHEN 'p' THEN 'a table' WHEN 'v' THEN 'a view' WHEN 'm' THEN 'a materialized view'
			WHEN 'S' THEN 'a sequence' ELSE 'a relation' END END,
	COALESCE((SELECT f.n FROM (SELECT c.relname || '_old' || CASE WHEN g = 1 THEN '' ELSE g::text END AS n, g FROM generate_series(1, 100) AS g) AS f
	WHERE NOT EXISTS (SELECT 1 FROM pg_class o WHERE o.relnamespace = c.relnamespace AND o.relname = f.n) ORDER BY f.g LIMIT 1), c.relname || '_old')
	FROM pg_class c LEFT JOIN pg_index x ON x.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = x.indrelid
	WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = $1::regclass) AND c.relname = ANY ($2)`, table, all)
	if err != nil {
		return Catalog{}, err
	}
	c := Catalog{Rels: map[string]Rel{}}
	var name string
	var r Rel
	if _, err := pgx.ForEachRow(rows, []any{&name, &r.OnTable, &r.Valid, &r.Def, &r.OID, &r.Holder, &r.Free}, func() error {
		if !r.OnTable || r.Def != "" { // "": dropped since the scan began
			c.Rels[name] = r
		}
		return nil
	}); err != nil {
		return Catalog{}, err
	}
	var invalid []uint32
	for _, r := range c.Rels {
		if r.OnTable && !r.Valid {
			invalid = append(invalid, r.OID)
		}
	}
	building, err := c.buildsUnderWay(ctx, db, invalid)
	if err != nil {
		return Catalog{}, err
	}
	for name, r := range c.Rels {
		r.Building = building[r.OID]
		c.Rels[name] = r
	}
	return c, nil
}

// buildsUnderWay returns which of the indexes oids (invalid ones) a CREATE
// INDEX CONCURRENTLY under way in this database builds, as
// pg_stat_progress_create_index shows them to db's user: its own builds,
// or all with pg_read_all_stats; and those valid once the view is read,
// whose build ended since the catalog was read. It sets c.Hidden when the view shows a
// build without its index, and c.Unread when the view answers with an
// error. ctx's end and a timeout are returned.
func (c *Catalog) buildsUnderWay(ctx context.Context, db DB, oids []uint32) (map[uint32]bool, error) {
	if len(oids) == 0 {
		return nil, nil
	}
	building := map[uint32]bool{}
	hidden := false
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT index_relid FROM pg_stat_progress_create_index
	WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND (index_relid IS NULL OR index_relid = ANY ($1::oid[]))`, oids)
		if err != nil {
			return err
		}
		var oid *uint32
		_, err = pgx.ForEachRow(rows, []any{&oid}, func() error {
			if oid == nil {
				hidden = true
			} else {
				building[*oid] = true
			}
			return nil
		})
		if err != nil {
			return err
		}
		// Read after the view: an index invalid in the catalog and valid
		// now was being built when the catalog was read, its build ended
		// before the view was (dropping it would drop an index that
		// serves).
		rows, err = tx.Query(ctx, `SELECT indexrelid FROM pg_index WHERE indexrelid = ANY ($1::oid[]) AND indisvalid`, oids)
		if err != nil {
			return err
		}
		var built uint32
		_, err = pgx.ForEachRow(rows, []any{&built}, func() error {
			building[built] = true
			return nil
		})
		return err
	})
	var ne net.Error
	switch {
	case err != nil && (ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()):
		return nil, err
	case err != nil:
		c.Unread = true
		return nil, nil
	}
	c.Hidden = hidden
	return building, nil
}

// State is what the schema holds for one expected index and its
// replacement, as the checks classify it.
type State struct {
	// Found, Valid, Building and Matches are of the index of the name on
	// the table (Found "": none).
	Found    string
	Valid    bool
	Building bool
	Matches  bool
	// HeldBy says what holds the name when it is not an index of the
	// table; RenameTo is a free name for that holder.
	HeldBy, RenameTo string
	// NewFound, NewValid, NewBuilding and NewMatches are the same of the
	// name with "_new" (a replacement's).
	NewFound    string
	NewValid    bool
	NewBuilding bool
	NewMatches  bool
	// NewHeldBy is HeldBy for the name with "_new"; NewTo a free name for
	// what holds it (another relation, or an index of the table).
	NewHeldBy, NewTo string
	// BuildHidden and BuildUnknown are Catalog.Hidden and Catalog.Unread
	// where the index or its replacement is invalid.
	BuildHidden, BuildUnknown bool
}

// State returns what c holds for the index name, matches telling whether
// a definition (pg_get_indexdef) is the expected one.
func (c Catalog) State(name string, matches func(def string) bool) State {
	var s State
	switch r, ok := c.Rels[name]; {
	case !ok:
	case !r.OnTable:
		s.HeldBy, s.RenameTo = r.Holder, r.Free
	default:
		s.Found, s.Valid, s.Building, s.Matches = r.Def, r.Valid, r.Building, matches(r.Def)
	}
	switch r, ok := c.Rels[name+NewSuffix]; {
	case !ok:
	case !r.OnTable:
		s.NewHeldBy, s.NewTo = r.Holder, r.Free
	default:
		s.NewFound, s.NewValid, s.NewBuilding, s.NewMatches = r.Def, r.Valid, r.Building, matches(r.Def)
		s.NewTo = r.Free
	}
	invalid := s.Found != "" && !s.Valid || s.NewFound != "" && !s.NewValid
	s.BuildHidden = c.Hidden && invalid
	s.BuildUnknown = c.Unread && invalid
	return s
}

// storageParams is the WITH (...) clause of an index definition.
var storageParams = regexp.MustCompile(` WITH \([^()]*\)`)

// Matches reports whether def, an index definition as pg_get_indexdef
// writes it, is the index want describes from USING on (method, columns
// with their operator classes, collations and sort order, included
// columns, predicate), UNIQUE or not as unique says. Storage parameters
// (WITH (fillfactor=...)) are not compared. Names must be identifiers
// without spaces: the first " USING " ends the table's name.
func Matches(def string, unique bool, want string) bool {
	head := "CREATE INDEX "
	if unique {
		head = "CREATE UNIQUE INDEX "
	}
	if !strings.HasPrefix(def, head) {
		return false
	}
	_, rest, ok := strings.Cut(def, " USING ")
	return ok && storageParams.ReplaceAllString(rest, "") == want
}

// Replace returns the statements that replace the index name of schema
// (both unquoted) by the one create builds under another name (a CREATE
// INDEX CONCURRENTLY IF NOT EXISTS statement), each to run on its own,
// outside a transaction: the new one built under the name with "_new"
// (dropped first, should a failed attempt have left it), then the old one
// dropped and the new one renamed. The old index serves the queries it can
// until the new one is built.
func Replace(schema, name string, create func(name string) string) []string {
	tmp := name + NewSuffix
	return []string{
		Drop(schema, tmp),
		create(tmp),
		Drop(schema, name),
		Rename(schema, tmp, name),
	}
}

// Drop is DROP INDEX CONCURRENTLY IF EXISTS of the index name of schema.
func Drop(schema, name string) string {
	return "DROP INDEX CONCURRENTLY IF EXISTS " + pgx.Identifier{schema, name}.Sanitize()
}

// Rename is ALTER INDEX of the index name of schema, renamed to.
func Rename(schema, name, to string) string {
	return "ALTER INDEX " + pgx.Identifier{schema, name}.Sanitize() + " RENAME TO " + pgx.Identifier{to}.Sanitize()
}
