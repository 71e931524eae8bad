// Package optimistic implements optimistic locking with a version column: an
// update names the version it read, and matches no row when someone else
// updated the row in between.
//
//	UPDATE orders SET status = $3, version = version + 1
//	 WHERE id = $1 AND version = $2
//	RETURNING version
//
// Zero rows matched gives [ErrVersionConflict]: the caller's copy is stale.
// [Retrier.Do] reloads and re-applies a change a bounded number of times and
// counts the conflicts it met. Nothing is held between the read and the
// write, so readers never wait; under heavy contention on one row a row lock
// (package rowlock) wastes less work.
//
// At REPEATABLE READ or SERIALIZABLE (a transaction's, or the database's
// default_transaction_isolation), an update that finds its row changed by a
// concurrent transaction fails with a serialization failure (SQLSTATE 40001)
// instead of matching no row. Run outside a transaction (on a pool, or a
// connection not in one), that statement was its own transaction and the
// failure is the same lost race: [Table.Update] reports it as [ErrVersionConflict]. In a
// transaction it aborted the whole transaction: Update returns it as is,
// [Retrier.Do] does not retry it (every later statement of the transaction
// would fail), and the caller re-runs the transaction (a job's handler
// returns it, and the job is retried).
package optimistic

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/berthq/berth/internal/notfound"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrVersionConflict reports an update whose expected version is no
	// longer the row's version. Reload and re-apply (see [Retrier]).
	ErrVersionConflict = errors.New("optimistic: version conflict")
	// ErrNotFound reports that no row has the key (a string key
	// PostgreSQL cannot store — a NUL byte, invalid UTF-8 — is answered
	// so without a query, leaving a transaction usable). It matches
	// sdk.ErrNotFound too, and arrives wrapped in sdk.Permanent: a job about
	// a row that does not exist cannot succeed (the same convention in every
	// concurrency package; ARCHITECTURE.md, "Error classes").
	ErrNotFound = notfound.New("optimistic: row not found")
)

// ConflictError is the error of an update that lost the race. It wraps
// [ErrVersionConflict].
type ConflictError struct {
	Table    string
	Key      any
	Expected int64 // the version the update named
	Actual   int64 // the row's version when the conflict was found
}

// Error describes the conflict.
func (e *ConflictError) Error() string {
	return fmt.Sprintf("optimistic: %s %s: expected version %d, found %d", e.Table, sqlident.KeyText(e.Key), e.Expected, e.Actual)
}

// Unwrap returns ErrVersionConflict.
func (e *ConflictError) Unwrap() error { return ErrVersionConflict }

// DB is what the statements run on: a pgx.Tx, *pgx.Conn or *pgxpool.Pool.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Options configure a [Table].
type Options struct {
	// Table name, optionally schema-qualified. Required. Validated and quoted.
	Table string
	// KeyColumn identifies the row. Default "id".
	KeyColumn string
	// VersionColumn holds the version, an integer. Default "version".
	VersionColumn string
}

// Table runs versioned reads and updates on one table. It is safe for
// concurrent use.
type Table struct {
	name    string
	table   string // quoted
	key     string // quoted
	version string // quoted
}

// New validates opts and returns a Table.
func New(opts Options) (*Table, error) {
	t := &Table{name: opts.Table}
	var err error
	if t.table, t.key, t.version, err = sqlident.Keyed(opts.Table, opts.KeyColumn, opts.VersionColumn, "version"); err != nil {
		return nil, fmt.Errorf("optimistic: %w", err)
	}
	return t, nil
}

// Get reads the row's version and the given columns into dest (one target per
// column). A missing row gives a permanent [ErrNotFound].
func (t *Table) Get(ctx context.Context, db DB, key any, columns []string, dest ...any) (int64, error) {
	if len(columns) != len(dest) {
		return 0, fmt.Errorf("optimistic: %d columns but %d destinations", len(columns), len(dest))
	}
	cols, err := sqlident.Columns(columns)
	if err != nil {
		return 0, fmt.Errorf("optimistic: %w", err)
	}
	if sqlident.UnstorableKey(key) {
		return 0, t.wrap(ctx, key, pgx.ErrNoRows) // no row holds it
	}
	var version int64
	q := "SELECT " + strings.Join(append([]string{t.version}, cols...), ", ") +
		" FROM " + t.table + " WHERE " + t.key + " = $1"
	if err := db.QueryRow(ctx, q, key).Scan(append([]any{&version}, dest...)...); err != nil {
		return 0, t.wrap(ctx, key, err)
	}
	return version, nil
}

// Update sets the columns in set on the row whose key is key, provided its
// version is still version, and bumps the version. It returns the new
// version. A stale version gives a [*ConflictError] ([ErrVersionConflict]),
// as does a serialization failure of an Update run outside a transaction
// (see the package doc); a missing row gives a permanent [ErrNotFound].
// Column names are validated and quoted; values are bind parameters. set must not name the key or version column.
func (t *Table) Update(ctx context.Context, db DB, key any, version int64, set map[string]any) (int64, error) {
	names := make([]string, 0, len(set))
	for c := range set {
		names = append(names, c)
	}
	slices.Sort(names) // one SQL text per column set: prepared once per connection
	var b strings.Builder
	b.WriteString("UPDATE " + t.table + " SET ")
	args := make([]any, 2, 2+len(names))
	args[0], args[1] = key, version
	for _, c := range names {
		q, err := sqlident.Column(c)
		if err != nil {
			return 0, fmt.Errorf("optimistic: %w", err)
		}
		if q == t.key || q == t.version {
			return 0, fmt.Errorf("optimistic: set names the key or version column %q", c)
		}
		args = append(args, set[c])
		b.WriteString(q + " = $" + strconv.Itoa(len(args)) + ", ")
	}
	if sqlident.UnstorableKey(key) {
		return 0, t.wrap(ctx, key, pgx.ErrNoRows) // no row holds it
	}
	b.WriteString(t.version + " = " + t.version + " + 1 WHERE " + t.key + " = $1 AND " +
		t.version + " = $2 RETURNING " + t.version)
	var next int64
	err := db.QueryRow(ctx, b.String(), args...).Scan(&next)
	if err == nil {
		return next, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) && !(serializationFailure(err) && ownTransaction(db)) {
		return 0, t.wrap(ctx, key, err)
	}
	// No row matched, or (REPEATABLE READ or SERIALIZABLE) the row changed
	// while the update waited for it: tell a stale version from a missing
	// row.
	var actual int64
	err = db.QueryRow(ctx, "SELECT "+t.version+" FROM "+t.table+" WHERE "+t.key+" = $1", key).Scan(&actual)
	if err != nil {
		return 0, t.wrap(ctx, key, err)
	}
	return 0, &ConflictError{Table: t.name, Key: key, Expected: version, Actual: actual}
}

// serializationFailure reports whether err is PostgreSQL's serialization
// failure (SQLSTATE 40001): at REPEATABLE READ or SERIALIZABLE, an update of
// a row another transaction changed after the statement's snapshot.
func serializationFailure(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001"
}

// ownTransaction reports whether the statement that just failed on db ran
// as its own transaction, outside any the caller opened: db is a pool (each
// statement on its own), or a connection now idle outside a transaction.
// A connection whose transaction the failure aborted, a pgx.Tx, or a DB it
// cannot look into is not.
func ownTransaction(db DB) bool {
	switch d := db.(type) {
	case *pgxpool.Pool:
		return true
	case interface{ PgConn() *pgconn.PgConn }: // *pgx.Conn
		return d.PgConn().TxStatus() == 'I'
	case interface{ Conn() *pgx.Conn }: // *pgxpool.Conn, pgx.Tx
		c := d.Conn()
		return c != nil && c.PgConn().TxStatus() == 'I'
	}
	return false
}

func (t *Table) wrap(ctx context.Context, key any, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return sdk.Permanent(fmt.Errorf("%w: %s %s", ErrNotFound, t.name, sqlident.KeyText(key)))
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("optimistic: %s %s: %w", t.name, sqlident.KeyText(key), err)
}

// DefaultMaxAttempts is the number of tries a zero [Retrier] makes.
const DefaultMaxAttempts = 5

// Retrier re-runs a read-modify-write that lost an optimistic race. The zero
// value is ready to use; a Retrier is safe for concurrent use and counts the
// conflicts of every call.
type Retrier struct {
	// MaxAttempts bounds the tries per Do call. Default DefaultMaxAttempts.
	MaxAttempts int
	// OnConflict, when set, is called after each conflict with the attempt
	// number (from 1) and the conflict error: a hook for an
	// optimistic-lock-conflict metric. It must be quick and safe for
	// concurrent use.
	OnConflict func(ctx context.Context, attempt int, err error)

	conflicts atomic.Int64
}

// Do calls attempt until it returns something other than an error wrapping
// [ErrVersionConflict], at most MaxAttempts times. Each call of attempt must
// reload the row (its version included) and re-apply the change: re-sending
// the stale write can never succeed. When every try conflicts, Do returns the
// last conflict wrapped in an [*ExhaustedError] (still matching
// ErrVersionConflict); the error is transient: a later retry of the job
// reloads again.
func (r *Retrier) Do(ctx context.Context, attempt func(ctx context.Context) error) error {
	limit := r.MaxAttempts
	if limit <= 0 {
		limit = DefaultMaxAttempts
	}
	var err error
	for i := 1; i <= limit; i++ {
		if err = attempt(ctx); !errors.Is(err, ErrVersionConflict) {
			return err
		}
		r.conflicts.Add(1)
		if r.OnConflict != nil {
			r.OnConflict(ctx, i, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return &ExhaustedError{Attempts: limit, Err: err}
}

// Conflicts returns the number of conflicts Do has met, over all calls.
func (r *Retrier) Conflicts() int64 { return r.conflicts.Load() }

// ExhaustedError reports that every attempt of [Retrier.Do] conflicted.
type ExhaustedError struct {
	Attempts int
	Err      error // the last conflict
}

// Error describes the exhausted retries.
func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("optimistic: %d attempts conflicted: %v", e.Attempts, e.Err)
}

// Unwrap returns the last conflict.
func (e *ExhaustedError) Unwrap() error { return e.Err }
