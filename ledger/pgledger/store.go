// Package pgledger is the PostgreSQL side of the job-state ledger: [Store]
// keeps the ledger's own tables (fed by the ledger on RabbitMQ, SQS and the
// memory broker), and [Jobs] reads the PostgreSQL broker's jobs table, which
// already is a ledger, through the same [ledger.Reader] API.
//
// Create the tables with [Store.Migrate], or apply [SQL] with your migration
// tool. Keep them bounded with [Store.Purge] and [Store.PurgeStale] (or
// ledger.RunJanitor, which runs both).
package pgledger

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/berthq/berth/internal/pgindex"
	"github.com/berthq/berth/internal/pgschema"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// DB is what the store needs of a connection pool; *pgxpool.Pool satisfies
// it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Options names the table. The zero value is berth.ledger_jobs.
type Options struct {
	// Schema holding the tables. Default "berth" (the PostgreSQL broker's).
	Schema string
	// Prefix of the table name: Prefix+"jobs". Default "ledger_".
	Prefix string
	// SynchronousCommit makes each Write wait until its batch is flushed
	// to the write-ahead log, as the session's synchronous_commit says.
	// By default a batch commits with synchronous_commit off: a database
	// crash may lose the last fraction of a second of ledger writes (never
	// a job, never the jobs' own tables, and never corrupting a row), the
	// same loss the ledger already accepts when its buffer overflows, and
	// in exchange no Write waits for a disk flush. See BENCHMARKS.md.
	SynchronousCommit bool
}

// Defaults of [Options].
const (
	DefaultSchema = "berth"
	DefaultPrefix = "ledger_"
)

// ErrInvalidOptions reports a bad schema or prefix.
var ErrInvalidOptions = errors.New("pgledger: invalid options")

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

func (o Options) withDefaults() (Options, error) {
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	for _, id := range []string{o.Schema, o.Prefix + "jobs_queue_status_idx"} {
		if !identRE.MatchString(id) {
			// Go-quoted, escaped once here: whoever shows the error
			// leaves its escapes as they are (berth does).
			return o, fmt.Errorf("%w: identifier %q: want 1-40 of [a-z0-9_], not starting with a digit", ErrInvalidOptions, id)
		}
	}
	return o, nil
}

// Store is the ledger's PostgreSQL store: a [ledger.Store] and a
// [ledger.Reader]. It is safe for concurrent use.
type Store struct {
	db               DB
	opts             Options
	jobs             string // quoted schema.table
	upsert           string
	redrive, redrAll string
	deadAny          string
}

var (
	_ ledger.Store       = (*Store)(nil)
	_ ledger.Reader      = (*Store)(nil)
	_ ledger.StalePurger = (*Store)(nil)
)

// attemptJSON builds, from row r of the table (or EXCLUDED, an event),
// the history entry of its current attempt.
func attemptJSON(r string) string {
	failed := r + `.status IN ('retrying', 'dead', 'released')`
	return `jsonb_build_array(jsonb_build_object('generation', ` + r + `.generation, 'attempt', ` + r + `.attempts,
	'status', ` + r + `.status, 'rank', ` + r + `.rank, 'started_at', ` + r + `.started_at, 'finished_at', ` + r + `.finished_at,
	'duration_us', ` + r + `.duration_us, 'error', CASE WHEN ` + failed + ` THEN ` + r + `.last_error END,
	'error_class', CASE WHEN ` + failed + ` THEN ` + r + `.error_class END, 'next_attempt_at', ` + r + `.next_attempt_at,
	'worker_id', ` + r + `.worker_id, 'updated_at', ` + r + `.updated_at))`
}

// attemptField is the SQL setting col, a fact of one attempt that not
// every event of it carries (its start, its worker): an event of a later
// attempt says it or leaves it unknown; one of the row's attempt fills it
// where the row has none, whether or not it is newer (the guard newer).
func attemptField(col, newer string) string {
	return col + ` = CASE WHEN (EXCLUDED.generation, EXCLUDED.attempts) > (j.generation, j.attempts) THEN EXCLUDED.` + col + `
		WHEN (EXCLUDED.generation, EXCLUDED.attempts) < (j.generation, j.attempts) THEN j.` + col + `
		WHEN ` + newer + ` THEN COALESCE(EXCLUDED.` + col + `, j.` + col + `)
		ELSE COALESCE(j.` + col + `, EXCLUDED.` + col + `) END`
}

// New returns a store on db. It does not touch the database; call
// [Store.Migrate] to create the table.
func New(db DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil DB", ErrInvalidOptions)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, opts: opts, jobs: pgx.Identifier{opts.Schema, opts.Prefix + "jobs"}.Sanitize()}
	// newer is the guard of the package doc, in SQL: an event replaces the
	// row's state only when it is of a later generation or attempt, or of
	// the same attempt, not final yet, and either final itself, or of a
	// delivery that started later (both starts known and different: two
	// deliveries of one attempt, as a RabbitMQ classic queue's redelivery
	// after a lost lease), or of the same delivery (or one of unknown
	// start) with a rank and time at least the row's. Fields that describe
	// the message (queue, type, keys, first seen) are merged whatever the
	// order, and so is the attempt's start: a settlement may carry none (a
	// run time of zero, a dead letter found by a sync), and the attempt's
	// running event landing after it must not lose it.
	const newer = `((EXCLUDED.generation, EXCLUDED.attempts) > (j.generation, j.attempts)
	OR ((EXCLUDED.generation, EXCLUDED.attempts) = (j.generation, j.attempts) AND j.rank < 3
		AND CASE WHEN EXCLUDED.rank < 3 AND EXCLUDED.started_at <> j.started_at
			THEN EXCLUDED.started_at > j.started_at
			ELSE (EXCLUDED.rank, EXCLUDED.updated_at) >= (j.rank, j.updated_at) END))`
	when := func(col, v string) string {
		return col + ` = CASE WHEN ` + newer + ` THEN ` + v + ` ELSE j.` + col + ` END`
	}
	// The history (a jsonb array, one entry per attempt state, read back
	// keeping each attempt's newest) gains the row's current attempt when
	// an event moves the row past it, an event of an earlier attempt than
	// the row's (a late write), and the attempts the batch itself moved
	// past (EXCLUDED.history). No other table is read: the statement's plan
	// cannot go wrong as the table grows.
	s.upsert = `INSERT INTO ` + s.jobs + ` AS j (message_id, queue, job_type, idempotency_key, correlation_id,
	status, rank, generation, attempts, last_error, error_class, next_attempt_at, first_seen_at,
	started_at, finished_at, duration_us, worker_id, updated_at, history)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::smallint[],
	$8::int[], $9::int[], $10::text[], $11::text[], $12::timestamptz[], $13::timestamptz[], $14::timestamptz[],
	$15::timestamptz[], $16::bigint[], $17::text[], $18::timestamptz[], $19::jsonb[])
ON CONFLICT (message_id) DO UPDATE SET
	history = j.history
		|| CASE WHEN (EXCLUDED.generation, EXCLUDED.attempts) > (j.generation, j.attempts) AND j.attempts > 0 AND j.rank >= 1
			THEN ` + attemptJSON("j") + ` ELSE '[]'::jsonb END
		|| CASE WHEN (EXCLUDED.generation, EXCLUDED.attempts) < (j.generation, j.attempts) AND EXCLUDED.attempts > 0 AND EXCLUDED.rank >= 1
			THEN ` + attemptJSON("EXCLUDED") + ` ELSE '[]'::jsonb END
		|| EXCLUDED.history,
	queue = CASE WHEN j.queue = '' THEN EXCLUDED.queue ELSE j.queue END,
	job_type = CASE WHEN j.job_type = '' THEN EXCLUDED.job_type ELSE j.job_type END,
	idempotency_key = COALESCE(j.idempotency_key, EXCLUDED.idempotency_key),
	correlation_id = CASE WHEN j.correlation_id = '' THEN EXCLUDED.correlation_id ELSE j.correlation_id END,
	first_seen_at = LEAST(j.first_seen_at, EXCLUDED.first_seen_at),
	` + when("status", "EXCLUDED.status") + `,
	` + when("last_error", "COALESCE(EXCLUDED.last_error, j.last_error)") + `,
	` + when("error_class", "COALESCE(EXCLUDED.error_class, j.error_class)") + `,
	` + when("next_attempt_at", "EXCLUDED.next_attempt_at") + `,
	` + attemptField("started_at", newer) + `,
	` + when("finished_at", "EXCLUDED.finished_at") + `,
	` + when("duration_us", "EXCLUDED.duration_us") + `,
	` + attemptField("worker_id", newer) + `,
	` + when("rank", "EXCLUDED.rank") + `,
	` + when("generation", "EXCLUDED.generation") + `,
	` + when("attempts", "EXCLUDED.attempts") + `,
	` + when("updated_at", "EXCLUDED.updated_at")
	// A redrive files the dead attempt in the history and starts a new
	// generation.
	const redriven = `status = 'redriven', rank = 0, generation = j.generation + 1, attempts = 0,
	next_attempt_at = NULL, started_at = NULL, finished_at = NULL, duration_us = NULL, updated_at = $2`
	redrive := `history = j.history || CASE WHEN j.attempts > 0 THEN ` + attemptJSON("j") + ` ELSE '[]'::jsonb END, ` + redriven
	s.redrive = `UPDATE ` + s.jobs + ` j SET ` + redrive + `
WHERE j.message_id = $1 AND j.status = 'dead' AND j.updated_at <= $2`
	// A dead letter whose attempt the broker did not say (RabbitMQ's
	// delivery limit without x-delivery-count) ends the generation's
	// current attempt, whatever its number, unless it already ended final.
	s.deadAny = `UPDATE ` + s.jobs + ` j SET status = 'dead', rank = 3, last_error = $2, error_class = $3,
	next_attempt_at = NULL, duration_us = NULL, finished_at = $4, updated_at = GREATEST(j.updated_at, $4)
WHERE j.message_id = $1 AND j.generation = $5 AND j.rank < 3`
	s.redrAll = `UPDATE ` + s.jobs + ` j SET ` + redrive + `
WHERE j.queue = $1 AND j.status = 'dead' AND j.updated_at <= $2`
	return s, nil
}

// Table returns the quoted, schema-qualified name of the jobs table.
func (s *Store) Table() string { return s.jobs }

// SQL returns the DDL of the ledger's tables and indexes for opts, with
// validated, quoted identifiers. Every statement is idempotent.
func SQL(opts Options) (string, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return "", err
	}
	q := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	jobs := pgx.Identifier{opts.Schema, opts.Prefix + "jobs"}.Sanitize()
	return `CREATE SCHEMA IF NOT EXISTS ` + q(opts.Schema) + `;
CREATE TABLE IF NOT EXISTS ` + jobs + ` (
    message_id      text        PRIMARY KEY,
    queue           text        NOT NULL DEFAULT '',
    job_type        text        NOT NULL DEFAULT '',
    idempotency_key text,
    correlation_id  text        NOT NULL DEFAULT '',
    status          text        NOT NULL CHECK (status IN ('enqueued', 'running', 'retrying', 'released', 'succeeded', 'dead', 'redriven')),
    rank            smallint    NOT NULL, -- ledger.Status.Rank: orders the states of one attempt
    generation      integer     NOT NULL DEFAULT 0, -- redrives
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    error_class     text,
    next_attempt_at timestamptz,
    first_seen_at   timestamptz NOT NULL,
    started_at      timestamptz,
    finished_at     timestamptz,
    duration_us     bigint,
    worker_id       text,
    updated_at      timestamptz NOT NULL,
    history         jsonb       NOT NULL DEFAULT '[]' -- earlier attempts' states, see Store.Job
);
` + indexDDL(opts), nil
}

// jobIndexes are the indexes [SQL] creates on the jobs table (their names
// after the prefix), with what their absence costs. cols and where are
// written as pg_get_indexdef writes them back (where without its
// parentheses), so that [Store.Indexes] compares them with what the
// database holds.
var jobIndexes = []struct{ suffix, cols, where, cost string }{
	{"jobs_key_idx", "idempotency_key, first_seen_at", "idempotency_key IS NOT NULL", "a lookup by idempotency key (berth job show KEY) scans the whole table"},
	{"jobs_queue_status_idx", "queue, status, updated_at, message_id", "", "lists and counts by queue and status scan the whole table"},
	{"jobs_updated_idx", "updated_at, message_id", "", "the janitor's purges and the counts by window scan the whole table"},
	{"jobs_first_seen_idx", "first_seen_at, message_id", "", "every page of a job list sorts the whole table (List's order)"},
}

// indexDDL is the CREATE INDEX statements of [SQL] for opts (with defaults).
func indexDDL(opts Options) string {
	var b strings.Builder
	for _, ix := range indexes(opts) {
		b.WriteString(ix.Create(false) + ";\n")
	}
	return b.String()
}

// indexes are the indexes [SQL] creates on the jobs table for opts (with
// defaults), as expected, in [SQL]'s order.
func indexes(opts Options) []Index {
	jobs := pgx.Identifier{opts.Schema, opts.Prefix + "jobs"}.Sanitize()
	out := make([]Index, 0, len(jobIndexes))
	for _, ix := range jobIndexes {
		want := "btree (" + ix.cols + ")"
		on := jobs + " (" + ix.cols + ")"
		if ix.where != "" {
			want += " WHERE (" + ix.where + ")"
			on += " WHERE " + ix.where
		}
		name := opts.Prefix + ix.suffix
		x := Index{Name: name, Cost: ix.cost, Want: want, Drop: pgindex.Drop(opts.Schema, name), schema: opts.Schema, on: " ON " + on}
		x.replace = pgindex.Replace(opts.Schema, name, x.create)
		out = append(out, x)
	}
	return out
}

// Index is one index [SQL] creates on the jobs table, as expected and as
// the database holds it ([Store.Indexes]).
type Index struct {
	// Name is the index's name (in the table's schema).
	Name string
	// Cost says what its absence costs.
	Cost string
	// Want is its definition as PostgreSQL writes it back
	// (pg_get_indexdef, from USING on): method, columns, predicate.
	Want string
	// Found is its definition in the database (pg_get_indexdef); "" when
	// there is no index of that name on the table.
	Found string
	// Valid is false for an index a failed CREATE INDEX CONCURRENTLY left:
	// PostgreSQL keeps it up to date but never reads it. It is false too
	// while one under way builds it (Building).
	Valid bool
	// Building is true while a CREATE INDEX CONCURRENTLY under way builds
	// it, when the database shows that build to the caller's role (its
	// own, or any with pg_read_all_stats): dropping it throws the build
	// away. It is true too, Valid false, for one read invalid whose build
	// ended before that view was read: it serves, read again.
	Building bool
	// BuildHidden is true when Valid (of Found) or NewValid (of NewFound)
	// is false and
	// pg_stat_progress_create_index shows a build under way in the
	// database without saying of which index (another role's, to a role
	// without pg_read_all_stats): the invalid index may be that build's,
	// which dropping it would throw away.
	BuildHidden bool
	// BuildUnknown is true when Valid (of Found) or NewValid (of
	// NewFound) is false and pg_stat_progress_create_index could not be
	// read (its SELECT revoked): whether a build under way is that
	// invalid index's is not known.
	BuildUnknown bool
	// HeldBy says what holds its name in the schema when no index of that
	// name is on the table (Found is ""): as an index a renamed jobs table
	// took along, "an index of " and that table's name as read (untrusted
	// text). CREATE INDEX IF NOT EXISTS (Migrate) skips such a name. ""
	// when the name is free.
	HeldBy string
	// Matches reports whether Found is Want: a plain (not unique) index
	// with the same method, columns (their order, operator classes,
	// collations and sort order), included columns and predicate; storage
	// parameters (WITH (fillfactor=...)) are not compared. An index made
	// by hand under the name, or by an earlier release with other columns,
	// does not match: CREATE INDEX IF NOT EXISTS (Migrate) keeps it.
	Matches bool
	// NewFound, NewValid, NewBuilding and NewMatches are Found, Valid,
	// Building and Matches for the index of its name with "_new" on the
	// table, which Replace builds: a replacement whose statements were not
	// all run (under way, built but not swapped in, or failed). NewFound is
	// "" when there is none.
	NewFound    string
	NewValid    bool
	NewBuilding bool
	NewMatches  bool
	// NewHeldBy is HeldBy for the name with "_new": what holds it in the
	// schema when no index of that name is on the table, as an index of
	// an archived table (untrusted text). Replace's first statement would
	// drop that index: RenameNew frees the name first. "" when it is not
	// held elsewhere.
	NewHeldBy string
	// Drop is the statement that drops it (DROP INDEX CONCURRENTLY IF
	// EXISTS), to run before Create when it is invalid (one that does not
	// match: Replace).
	Drop string

	schema   string   // the table's
	on       string   // " ON table (columns) WHERE predicate"
	renameTo string   // HeldBy: a free name for the holder, as read by Indexes ("": the name with "_old")
	newTo    string   // NewHeldBy or NewFound: a free name for the index of the name with "_new" ("": that name with "_old")
	replace  []string // Replace
}

// Replace returns the statements that replace a valid index of its name
// that does not match (Matches), each to run on its own, outside a
// transaction: the index built CONCURRENTLY under the name with "_new"
// (dropped first, should a failed attempt have left it), then the old one
// dropped CONCURRENTLY and the new one renamed. The old index serves the
// queries it can until the new one is built; dropped first (Drop, then
// Create), the lists and counts it serves would scan the whole table for
// as long as the build takes.
func (ix Index) Replace() []string { return slices.Clone(ix.replace) }

// Rename returns the statement that gives the index of its name another
// name (ALTER INDEX ... RENAME TO the name with "_old", or with "_old2"
// and on when [Store.Indexes] found that taken, as by a table archived
// before), to run before Create when that index is another table's
// (HeldBy).
func (ix Index) Rename() string {
	to := ix.renameTo
	if to == "" {
		to = ix.Name + "_old"
	}
	return pgindex.Rename(ix.schema, ix.Name, to)
}

// RenameNew returns the statement that gives the index holding the name
// with "_new" another name (ALTER INDEX ... RENAME TO that name with
// "_old", or "_old2" and on when taken), to run before Replace when that
// index is another table's (NewHeldBy), or one of the table that is valid
// and not as SQL has it (NewFound, NewValid, !NewMatches: made otherwise,
// as by hand, and may serve queries), which Replace's first statement
// would drop.
func (ix Index) RenameNew() string {
	to := ix.newTo
	if to == "" {
		to = ix.Name + "_new_old"
	}
	return pgindex.Rename(ix.schema, ix.Name+pgindex.NewSuffix, to)
}

// Create returns its CREATE INDEX statement, CONCURRENTLY (as on a table
// in use: a plain one blocks the ledger's writes while it builds) or not.
func (ix Index) Create(concurrently bool) string {
	if concurrently {
		return ix.create(ix.Name)
	}
	return "CREATE INDEX IF NOT EXISTS " + pgx.Identifier{ix.Name}.Sanitize() + ix.on
}

// create is Create(true) under name.
func (ix Index) create(name string) string {
	return "CREATE INDEX CONCURRENTLY IF NOT EXISTS " + pgx.Identifier{name}.Sanitize() + ix.on
}

// OK reports whether the index is present, valid and as [SQL] creates it.
func (ix Index) OK() bool { return ix.Found != "" && ix.Valid && ix.Matches }

// Indexes returns the indexes [SQL] creates on the jobs table, in [SQL]'s
// order, each with what the database holds under its name: a table made by
// an earlier release lacks those added since until [Store.Migrate] runs,
// and has those changed since as they were (Migrate does not replace an
// index that exists), and with the replacement [Index.Replace] builds
// under the name with "_new", if one is on the table (NewFound). The
// doctor reports them (ledger.indexes). A missing table gives an error.
// Builds under way are read from pg_stat_progress_create_index in a
// transaction of their own (a savepoint when the store's DB is a
// transaction): where that view answers with an error (its SELECT
// revoked), the indexes are still returned, with BuildUnknown; ctx's end
// or a timeout of that query is returned, as any other query's.
func (s *Store) Indexes(ctx context.Context) ([]Index, error) {
	out := indexes(s.opts)
	names := make([]string, len(out))
	for i, ix := range out {
		names[i] = ix.Name
	}
	c, err := pgindex.Read(ctx, s.db, s.jobs, names)
	if err != nil {
		return nil, fmt.Errorf("pgledger: indexes: %w", err)
	}
	for i, ix := range out {
		st := c.State(ix.Name, func(def string) bool { return pgindex.Matches(def, false, ix.Want) })
		out[i].Found, out[i].Valid, out[i].Building, out[i].Matches = st.Found, st.Valid, st.Building, st.Matches
		out[i].HeldBy, out[i].renameTo = st.HeldBy, st.RenameTo
		out[i].NewFound, out[i].NewValid, out[i].NewBuilding, out[i].NewMatches = st.NewFound, st.NewValid, st.NewBuilding, st.NewMatches
		out[i].NewHeldBy, out[i].newTo = st.NewHeldBy, st.NewTo
		out[i].BuildHidden, out[i].BuildUnknown = st.BuildHidden, st.BuildUnknown
	}
	return out, nil
}

// MissingIndexes returns the indexes [SQL] creates on the jobs table that
// are missing, invalid (a CREATE INDEX CONCURRENTLY that failed leaves one
// invalid) or defined otherwise ([Index.Matches]), each as "name: what its
// absence costs", in [SQL]'s order. See [Store.Indexes], which says which
// and how. A missing table gives an error.
func (s *Store) MissingIndexes(ctx context.Context) ([]string, error) {
	ixs, err := s.Indexes(ctx)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, ix := range ixs {
		if !ix.OK() {
			missing = append(missing, ix.Name+": "+ix.Cost)
		}
	}
	return missing, nil
}

// Migrate creates the tables and indexes when they do not exist. It is
// idempotent and safe to run from many processes at once: it takes a
// transaction-scoped advisory lock so concurrent runs do not race on
// CREATE ... IF NOT EXISTS.
func (s *Store) Migrate(ctx context.Context) error {
	ddl, err := SQL(s.opts)
	if err != nil {
		return err
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgledger: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := pgschema.Lock(ctx, tx, s.opts.Schema); err != nil {
		return fmt.Errorf("pgledger: migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "berth.ledger.migrate."+s.jobs); err != nil {
		return fmt.Errorf("pgledger: migrate: %w", err)
	}
	// Done already (every process that starts runs Migrate): no DDL, so no
	// lock on the jobs table, which every Writer writes to
	// (pgschema.Present). An index that exists but is invalid or defined
	// otherwise is Indexes' and doctor's to report, as before: CREATE
	// INDEX IF NOT EXISTS never replaced it. A later version that alters
	// what exists must check for its change here too.
	names := []string{s.opts.Prefix + "jobs"}
	for _, ix := range indexes(s.opts) {
		names = append(names, ix.Name)
	}
	done, err := pgschema.Present(ctx, tx, s.opts.Schema, names...)
	if err != nil {
		return fmt.Errorf("pgledger: migrate: %w", err)
	}
	if done {
		return nil
	}
	if _, err := tx.Exec(ctx, ddl, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("pgledger: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgledger: migrate: %w", err)
	}
	return nil
}

// row is an event as the tables take it, after merging the events of one
// batch that name the same row (one statement cannot update a row twice).
type row struct {
	ledger.Event
	firstSeen, finished time.Time
}

// newer is the SQL guard in Go, for merging within a batch.
func newer(e, r ledger.Event) bool {
	if c := cmp.Compare(e.Generation, r.Generation); c != 0 {
		return c > 0
	}
	if c := cmp.Compare(e.Attempt, r.Attempt); c != 0 {
		return c > 0
	}
	if r.Status.Rank() >= 3 {
		return false
	}
	if c, ok := otherDelivery(e, r); ok {
		return e.Status.Rank() >= 3 || c > 0
	}
	if c := cmp.Compare(e.Status.Rank(), r.Status.Rank()); c != 0 {
		return c > 0
	}
	return !e.At.Before(r.At)
}

// otherDelivery compares the starts of e and r, events of one attempt, as
// the table keeps them (microseconds, no monotonic reading): ok when both
// are known and differ, that is when they are of two deliveries of the
// attempt (a redelivery that keeps its attempt: a RabbitMQ classic queue's
// after a lost lease, a release's), and then c > 0 when e's started later.
func otherDelivery(e, r ledger.Event) (c int, ok bool) {
	if e.StartedAt.IsZero() || r.StartedAt.IsZero() {
		return 0, false
	}
	c = e.StartedAt.Truncate(time.Microsecond).Compare(r.StartedAt.Truncate(time.Microsecond))
	return c, c != 0
}

func toRow(e ledger.Event) row {
	r := row{Event: e, firstSeen: e.At}
	if e.Status.Rank() >= 2 || e.Status == ledger.StatusReleased {
		r.finished = e.At
	}
	return r
}

// merge folds e into r as the upsert would.
func merge(r *row, e ledger.Event) {
	n := toRow(e)
	other := e
	old := r.Event
	if newer(e, old) {
		r.Event, r.finished, other = e, n.finished, old
		if r.Error == "" {
			r.Error = old.Error
		}
		if r.Class == "" {
			r.Class = old.Class
		}
	}
	// The attempt's start and worker, as attemptField.
	if e.Generation == old.Generation && e.Attempt == old.Attempt {
		if r.Worker == "" {
			r.Worker = other.Worker
		}
		if r.StartedAt.IsZero() {
			r.StartedAt = other.StartedAt
		}
	}
	fill := func(dst *string, v string) {
		if *dst == "" {
			*dst = v
		}
	}
	fill(&r.Queue, other.Queue)
	fill(&r.Type, other.Type)
	fill(&r.IdempotencyKey, other.IdempotencyKey)
	fill(&r.CorrelationID, other.CorrelationID)
	if n.firstSeen.Before(r.firstSeen) {
		r.firstSeen = n.firstSeen
	}
}

// attemptNewer orders the states of one attempt: succeeded and dead are
// final, and so is retrying within one delivery of it; of two deliveries
// of it, the one that started later replaces the other's states (as
// newer does).
func attemptNewer(e, r ledger.Event) bool {
	if r.Status.Rank() >= 3 {
		return false
	}
	if c, ok := otherDelivery(e, r); ok {
		return e.Status.Rank() >= 3 || c > 0
	}
	if r.Status.Rank() >= 2 {
		return false
	}
	if c := cmp.Compare(e.Status.Rank(), r.Status.Rank()); c != 0 {
		return c > 0
	}
	return !e.At.Before(r.At)
}

// historyEntry is one attempt state in the history column.
type historyEntry struct {
	Generation    int          `json:"generation"`
	Attempt       int          `json:"attempt"`
	Status        string       `json:"status"`
	Rank          int          `json:"rank"`
	StartedAt     *historyTime `json:"started_at"`
	FinishedAt    *historyTime `json:"finished_at"`
	DurationUS    *int64       `json:"duration_us"`
	Error         *string      `json:"error"`
	ErrorClass    *string      `json:"error_class"`
	NextAttemptAt *historyTime `json:"next_attempt_at"`
	WorkerID      *string      `json:"worker_id"`
	UpdatedAt     historyTime  `json:"updated_at"`
}

// Write applies batch in one statement per kind: the job rows (with the
// history the package doc describes), then the redrives, in one round
// trip and one transaction. It does not retain batch.
func (s *Store) Write(ctx context.Context, batch []ledger.Event) error {
	// Text from messages is untrusted: PostgreSQL refuses NUL and invalid
	// UTF-8 in text, and an index row too long, and one such event would
	// fail the whole batch's statement, losing the other jobs' events with
	// it.
	batch = storable(batch)
	jobs := map[string]*row{}
	var redrives, deadAny []ledger.Event
	for _, e := range batch {
		if !e.Status.Valid() {
			continue
		}
		if e.Status == ledger.StatusDead && e.Attempt == 0 && e.MessageID != "" {
			// A broker's dead letter of unknown attempt: see deadAny.
			deadAny = append(deadAny, e)
			continue
		}
		if e.Status == ledger.StatusRedriven {
			redrives = append(redrives, e)
			continue
		}
		if e.MessageID == "" {
			continue
		}
		if r, ok := jobs[e.MessageID]; ok {
			merge(r, e)
		} else {
			r := toRow(e)
			jobs[e.MessageID] = &r
		}
	}
	// The events of attempts other than their job's final one in this
	// batch are history.
	type akey struct {
		id       string
		gen, att int
	}
	attempts := map[akey]*row{}
	for _, e := range batch {
		r := jobs[e.MessageID]
		if r == nil || e.Status == ledger.StatusRedriven || e.Attempt == 0 || e.Status.Rank() < 1 ||
			e.Generation == r.Generation && e.Attempt == r.Attempt {
			continue
		}
		k := akey{e.MessageID, e.Generation, e.Attempt}
		if a, ok := attempts[k]; !ok {
			a := toRow(e)
			attempts[k] = &a
		} else if attemptNewer(e, a.Event) {
			started, worker := a.StartedAt, a.Worker
			*a = toRow(e)
			if a.StartedAt.IsZero() {
				a.StartedAt = started
			}
			if a.Worker == "" {
				a.Worker = worker
			}
		} else {
			// An older state of the attempt, written after its final one:
			// keep what the final one does not say.
			if a.StartedAt.IsZero() {
				a.StartedAt = e.StartedAt
			}
			if a.Worker == "" {
				a.Worker = e.Worker
			}
		}
	}
	history := map[string][]historyEntry{}
	for _, a := range attempts {
		var e, c *string
		if a.Status.Rank() >= 2 && a.Status != ledger.StatusSucceeded || a.Status == ledger.StatusReleased {
			e, c = nonEmpty(a.Error), nonEmpty(string(a.Class))
		}
		history[a.MessageID] = append(history[a.MessageID], historyEntry{Generation: a.Generation, Attempt: a.Attempt,
			Status: string(a.Status), Rank: a.Status.Rank(), StartedAt: newHistoryTime(a.StartedAt), FinishedAt: newHistoryTime(a.finished),
			DurationUS: duration(a.Status, a.Duration), Error: e, ErrorClass: c, NextAttemptAt: newHistoryTime(a.NextAttemptAt),
			WorkerID: nonEmpty(a.Worker), UpdatedAt: historyTime{a.At}})
	}
	b := &pgx.Batch{}
	if !s.opts.SynchronousCommit {
		// Local to the batch's implicit transaction: the pool's connection
		// keeps its own setting for other users.
		b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	}
	if len(jobs) > 0 {
		rows := make([]*row, 0, len(jobs))
		for _, r := range jobs {
			rows = append(rows, r)
		}
		// One order for every writer: concurrent batches lock rows in the
		// same order and cannot deadlock.
		slices.SortFunc(rows, func(a, b *row) int { return cmp.Compare(a.MessageID, b.MessageID) })
		n := len(rows)
		var (
			ids, queues, types, keys, corrs, statuses = make([]string, n), make([]string, n), make([]string, n), make([]*string, n), make([]string, n), make([]string, n)
			ranks                                     = make([]int16, n)
			gens, atts                                = make([]int32, n), make([]int32, n)
			errs, classes, workers                    = make([]*string, n), make([]*string, n), make([]*string, n)
			next, first, started, finished, updated   = make([]*time.Time, n), make([]time.Time, n), make([]*time.Time, n), make([]*time.Time, n), make([]time.Time, n)
			durs                                      = make([]*int64, n)
			hist                                      = make([]string, n)
		)
		for i, r := range rows {
			ids[i], queues[i], types[i], keys[i], corrs[i] = r.MessageID, r.Queue, r.Type, nonEmpty(r.IdempotencyKey), r.CorrelationID
			statuses[i], ranks[i], gens[i], atts[i] = string(r.Status), int16(r.Status.Rank()), int32(r.Generation), int32(r.Attempt)
			errs[i], classes[i], workers[i] = nonEmpty(r.Error), nonEmpty(string(r.Class)), nonEmpty(r.Worker)
			next[i], first[i], started[i], finished[i], updated[i] = nonZero(r.NextAttemptAt), r.firstSeen, nonZero(r.StartedAt), nonZero(r.finished), r.At
			durs[i] = duration(r.Status, r.Duration)
			hist[i] = "[]"
			if h := history[r.MessageID]; len(h) > 0 {
				j, err := json.Marshal(h)
				if err != nil {
					return fmt.Errorf("pgledger: write: history of %s: %w", r.MessageID, err)
				}
				hist[i] = string(j)
			}
		}
		b.Queue(s.upsert, ids, queues, types, keys, corrs, statuses, ranks, gens, atts, errs, classes,
			next, first, started, finished, durs, workers, updated, hist)
	}
	for _, e := range deadAny {
		b.Queue(s.deadAny, e.MessageID, nonEmpty(e.Error), nonEmpty(string(e.Class)), e.At, int32(e.Generation))
	}
	// Redrives go after the rows: a dead event and its redrive may share
	// a batch.
	for _, e := range redrives {
		switch {
		case e.RedriveAll:
			b.Queue(s.redrAll, e.Queue, e.At)
		case e.MessageID != "":
			b.Queue(s.redrive, e.MessageID, e.At)
		}
	}
	if b.Len() == 0 || b.Len() == 1 && !s.opts.SynchronousCommit {
		return nil
	}
	// The batch is one implicit transaction. Its upsert locks rows in one
	// order, but the dead letters without an attempt and the redrives by ID
	// that follow lock theirs after it: two writers (Options.Writers > 1)
	// each upserting the job the other redrives can deadlock, and
	// PostgreSQL then aborts one batch whole — every event of it lost.
	// Rolled back whole, it is sent again (its events are idempotent).
	for try := 1; ; try++ {
		err := s.db.SendBatch(ctx, b).Close()
		if err == nil {
			return nil
		}
		var pe *pgconn.PgError
		if try < deadlockTries && errors.As(err, &pe) && pe.Code == "40P01" && ctx.Err() == nil {
			b = requeued(b)
			continue
		}
		return fmt.Errorf("pgledger: write %d events: %w", len(batch), err)
	}
}

// requeued returns a new batch of b's statements and arguments. pgx keeps
// in a batch it sent the statements the connection prepared for it, and
// sends them by name again: a retry that a pool sends on another
// connection, which has not prepared them, fails ("prepared statement ...
// does not exist", SQLSTATE 26000).
func requeued(b *pgx.Batch) *pgx.Batch {
	out := &pgx.Batch{}
	for _, q := range b.QueuedQueries {
		out.Queue(q.SQL, q.Arguments...)
	}
	return out
}

// deadlockTries bounds the sends of a batch that PostgreSQL aborted as a
// deadlock victim (Write).
const deadlockTries = 3

// maxGeneration bounds a stored generation: it comes from a message's
// redrive-count header, which any producer can set, and a redrive adds one
// to it in SQL, where it is an integer.
const maxGeneration = 1 << 30

// storable returns batch with every text field PostgreSQL can store (NUL and
// invalid UTF-8 replaced by U+FFFD; an indexed one longer than
// maxIndexedText shortened, see indexedText), generations within maxGeneration and
// attempts within the integer column;
// batch itself when nothing needs it (the common case: no copy).
func storable(batch []ledger.Event) []ledger.Event {
	var out []ledger.Event
	for i, e := range batch {
		c := e
		for _, f := range []*string{&c.Type, &c.CorrelationID, &c.Error, &c.Worker} {
			*f = storableText(*f)
		}
		// The indexed ones bounded too: a value too long for a btree
		// index row would fail the statement like a NUL.
		for _, f := range []*string{&c.MessageID, &c.Queue, &c.IdempotencyKey} {
			*f = indexedText(*f)
		}
		// The class too: a dead letter's comes from its header.
		c.Class = sdk.ErrorClass(storableText(string(c.Class)))
		c.Generation = min(max(c.Generation, 0), maxGeneration)
		// The attempt too: a dead letter's comes from its header
		// (Ledger.SyncDeadLetters), and the column is an integer, which
		// a larger value would wrap around into (to a negative attempt,
		// or an early one).
		c.Attempt = min(max(c.Attempt, 0), math.MaxInt32)
		if out == nil && c == e {
			continue
		}
		if out == nil {
			out = append(make([]ledger.Event, 0, len(batch)), batch[:i]...)
		}
		out = append(out, c)
	}
	if out == nil {
		return batch
	}
	return out
}

// maxIndexedText bounds, in bytes, the text stored in an indexed column
// (message ID, queue, idempotency key). A btree index row holds at most
// 2704 bytes, and ledger_jobs_queue_status_idx holds a queue and a message
// ID together; PostgreSQL refuses a longer row (SQLSTATE 54000), failing
// the whole batch's statement. These come from messages (a foreign
// producer's key or ID, a dead letter's berth-dlq-queue header), which no
// one bounds.
const maxIndexedText = 1024

// indexedText is s as an indexed column stores it, and as a lookup of that
// column must send it: storableText, and when that is longer than
// maxIndexedText, its start (whole runes) followed by "…sha256:" and the
// SHA-256 of the whole text in hex, so that distinct long values stay
// distinct and every event of one job names the same row. It leaves its
// own results as they are.
func indexedText(s string) string {
	s = storableText(s)
	if len(s) <= maxIndexedText {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	tail := "…sha256:" + hex.EncodeToString(sum[:])
	head := s[:maxIndexedText-len(tail)]
	for len(head) > 0 && !utf8.ValidString(head) {
		head = head[:len(head)-1]
	}
	return head + tail
}

// storableText is s with NUL and invalid UTF-8 replaced by U+FFFD.
func storableText(s string) string {
	if utf8.ValidString(s) && !strings.Contains(s, "\x00") {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nonZero(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// duration is the handler run time of a settlement, in microseconds, and
// NULL for the other statuses.
func duration(st ledger.Status, d time.Duration) *int64 {
	if st.Rank() < 2 && st != ledger.StatusReleased || d <= 0 {
		return nil
	}
	us := d.Microseconds()
	return &us
}

// DefaultPurgeBatch is the batch size [Store.Purge] uses when given none.
const DefaultPurgeBatch = 1000

// Purge deletes the jobs that finished (succeeded or dead) before before,
// batch rows at a time (default 1000), until a batch
// comes back short or ctx is done. Each batch is its own short statement,
// oldest rows first, starting past the last row the batch before it
// deleted: the rows it keeps (jobs not finished, as a job delayed for
// weeks) are walked once per call, not once per batch. A row skipped while
// a writer held it is deleted by the next call. It returns how many jobs it
// deleted.
func (s *Store) Purge(ctx context.Context, before time.Time, batch int) (int, error) {
	return s.purge(ctx, "purge", `status IN ('succeeded', 'dead') AND updated_at < $1`, before, batch)
}

// PurgeStale deletes the jobs that never finished (any status but
// succeeded and dead) whose last update was before before and whose next
// attempt, if they have one (a retry's, a release's, or a delayed
// publish's due time, which ledger.Publisher records), was due before it
// too, batch rows at a time
// (default 1000), as [Store.Purge] does. These are the rows of jobs whose
// message left the broker without berth seeing it end (a queue purge, a
// broker's TTL or length limit): no event ever finishes them. A job still
// alive after all starts a new row at its next event. It returns how many
// jobs it deleted.
func (s *Store) PurgeStale(ctx context.Context, before time.Time, batch int) (int, error) {
	return s.purge(ctx, "purge stale", `status NOT IN ('succeeded', 'dead') AND updated_at < $1
			AND (next_attempt_at IS NULL OR next_attempt_at < $1)`, before, batch)
}

func (s *Store) purge(ctx context.Context, what, where string, before time.Time, batch int) (int, error) {
	if batch <= 0 {
		batch = DefaultPurgeBatch
	}
	// Each batch starts past the last row the one before deleted: the rows
	// it passed over (kept: not its to delete, or locked) lie behind that,
	// and a batch walking again from the oldest row read every one of them
	// before the rows it deletes — a run read them once per batch. The
	// next run starts from the oldest again, so a row skipped while locked
	// is deleted then. Two statements, not one with an optional bound
	// ("$3 IS NULL OR ..."), which a plan made for any parameters could not
	// use as the index scan's start.
	q := func(after string) string {
		return `WITH d AS (
	DELETE FROM ` + s.jobs + ` WHERE message_id IN (
		SELECT message_id FROM ` + s.jobs + ` WHERE ` + where + after + `
		ORDER BY updated_at, message_id LIMIT $2 FOR UPDATE SKIP LOCKED)
	RETURNING updated_at, message_id)
SELECT count(*), max(updated_at), (array_agg(message_id ORDER BY updated_at DESC, message_id DESC))[1] FROM d`
	}
	first, next := q(""), q(` AND (updated_at, message_id) > ($3, $4)`)
	total := 0
	var (
		lastAt pgtype.Timestamptz // as stored: '-infinity' too
		lastID *string
	)
	for {
		var n int
		var err error
		if lastID == nil {
			err = s.db.QueryRow(ctx, first, before, batch).Scan(&n, &lastAt, &lastID)
		} else {
			err = s.db.QueryRow(ctx, next, before, batch, lastAt, *lastID).Scan(&n, &lastAt, &lastID)
		}
		if err != nil {
			return total, fmt.Errorf("pgledger: %s: %w", what, err)
		}
		total += n
		if n < batch {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}
