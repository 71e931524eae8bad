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
// instead of matching no row; at SERIALIZABLE a read or write can also fail
// so on a read/write dependency, and any statement can be chosen as the
// victim of a deadlock (40P01) — with a concurrent migration, a trigger.
//
// Run outside a transaction (on a pool, or a connection not in one), that
// statement was its own transaction, rolled back with no effect, and the
// failure is a lost race like a stale version: [Table.Get] and [Table.Update]
// report it as a [*ConflictError] ([ErrVersionConflict]) whose Cause is the
// PostgreSQL error and whose message names it — the row's version may well
// be the one the update expected (a concurrent write that left the version
// alone, a deadlock, a dependency) — and [Retrier.Do] reloads and retries.
//
// In a transaction it aborted the whole transaction: Get and Update return
// it as the database error it is (errors.As finds the *pgconn.PgError; not
// a conflict), Retrier.Do does not retry it (every later statement of the
// transaction would fail), and the caller rolls back and re-runs the
// transaction (a job's handler returns it, and the job is retried).
package optimistic

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

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
	// ErrNullVersion reports a row whose version column is NULL (a column
	// added without a default, a row written around this package): no
	// version can match it, so no read-modify-write of it can succeed. It
	// arrives wrapped in sdk.Permanent; set the column (and make it NOT
	// NULL with a default) to repair the row.
	ErrNullVersion = errors.New("optimistic: version column is NULL")
)

// ConflictError is the error of a read or update that lost the race. It
// wraps [ErrVersionConflict], and Cause when there is one.
type ConflictError struct {
	Table    string
	Key      any
	Expected int64 // the version the update named (0 for a read)
	// Actual is the row's version when the conflict was found; -1 when it
	// could not be read again (and for a read).
	Actual int64
	// Op is the operation that lost the race: "update" (also when empty)
	// or "get".
	Op string
	// Cause is nil for a stale version: the update matched no row. Otherwise
	// it is the PostgreSQL error — a serialization failure (SQLSTATE 40001)
	// or a deadlock (40P01) — that rolled back the statement, run as its own
	// transaction (see the package doc). Actual may then equal Expected.
	Cause error
}

// Error describes the conflict. A conflict detected from a serialization
// failure or deadlock says so, with the row's version when known: "expected
// version 3, found 3" would tell an operator the versions matched and
// nothing was wrong.
func (e *ConflictError) Error() string {
	key := sqlident.KeyText(e.Key)
	if e.Cause == nil {
		return fmt.Sprintf("optimistic: %s %s: expected version %d, found %d", e.Table, key, e.Expected, e.Actual)
	}
	what := "serialization failure (SQLSTATE 40001)"
	if raceCode(e.Cause) == "40P01" {
		what = "deadlock (SQLSTATE 40P01)"
	}
	if e.Op == OpGet {
		return fmt.Sprintf("optimistic: %s %s: read rolled back by a %s, a lost race detected as a version conflict: %v",
			e.Table, key, what, e.Cause)
	}
	now := "the row could not be read again"
	if e.Actual >= 0 {
		now = fmt.Sprintf("the row is at version %d", e.Actual)
	}
	return fmt.Sprintf("optimistic: %s %s: update of version %d rolled back by a %s, a lost race detected as a version conflict (%s): %v",
		e.Table, key, e.Expected, what, now, e.Cause)
}

// Unwrap returns ErrVersionConflict, and Cause when not nil (so errors.As
// finds the *pgconn.PgError and its SQLSTATE).
func (e *ConflictError) Unwrap() []error {
	if e.Cause == nil {
		return []error{ErrVersionConflict}
	}
	return []error{ErrVersionConflict, e.Cause}
}

// The operations a [ConflictError] names.
const (
	OpGet    = "get"
	OpUpdate = "update"
)

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
// column). A missing row gives a permanent [ErrNotFound], a NULL version a
// permanent [ErrNullVersion]. A serialization
// failure or deadlock of a Get run outside a transaction is a
// [*ConflictError] ([ErrVersionConflict]); in a transaction it is returned
// as the database error, not a conflict (see the package doc).
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
	var version *int64
	q := "SELECT " + strings.Join(append([]string{t.version}, cols...), ", ") +
		" FROM " + t.table + " WHERE " + t.key + " = $1"
	if err := db.QueryRow(ctx, q, key).Scan(append([]any{&version}, dest...)...); err != nil {
		if lostRace(ctx, db, err) {
			return 0, &ConflictError{Table: t.name, Key: key, Actual: -1, Op: OpGet, Cause: err}
		}
		return 0, t.wrap(ctx, key, err)
	}
	if version == nil {
		return 0, t.nullVersion(key)
	}
	return *version, nil
}

// Update sets the columns in set on the row whose key is key, provided its
// version is still version, and bumps the version. It returns the new
// version. A stale version gives a [*ConflictError] ([ErrVersionConflict]),
// as does a serialization failure or deadlock of an Update run outside a
// transaction (with Cause set; see the package doc); a missing row gives a
// permanent [ErrNotFound], a NULL version a permanent [ErrNullVersion],
// and a key or value PostgreSQL cannot read (a
// data exception, SQLSTATE class 22) a permanent error wrapping PostgreSQL's.
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
	var cause error // the serialization failure or deadlock, if that was it
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case lostRace(ctx, db, err):
		cause = err
	default:
		return 0, t.wrap(ctx, key, err)
	}
	// No row matched, or (REPEATABLE READ or SERIALIZABLE) the row changed
	// while the update waited for it, or the statement lost another race:
	// tell a stale version from a missing row.
	var actual *int64
	err = db.QueryRow(ctx, "SELECT "+t.version+" FROM "+t.table+" WHERE "+t.key+" = $1", key).Scan(&actual)
	if err != nil {
		if lostRace(ctx, db, err) { // the update lost anyway; a reload tells
			return 0, &ConflictError{Table: t.name, Key: key, Expected: version, Actual: -1, Op: OpUpdate, Cause: err}
		}
		return 0, t.wrap(ctx, key, err)
	}
	if actual == nil {
		return 0, t.nullVersion(key)
	}
	return 0, &ConflictError{Table: t.name, Key: key, Expected: version, Actual: *actual, Op: OpUpdate, Cause: cause}
}

// raceCode returns the SQLSTATE of err when PostgreSQL rolled back the
// statement (its transaction) as the loser of a race with a concurrent
// transaction: "40001", a serialization failure (at REPEATABLE READ or
// SERIALIZABLE, a row another transaction changed after the snapshot, or a
// read/write dependency), or "40P01", a deadlock victim. Else "".
func raceCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01") {
		return pgErr.Code
	}
	return ""
}

// lostRace reports whether err is a serialization failure or deadlock of a
// statement that ran on db as its own transaction, so re-running the
// read-modify-write is safe: a lost race, not an error. In the caller's
// transaction the failure aborted it, and it is not. A cancelled ctx is
// not a race either.
func lostRace(ctx context.Context, db DB, err error) bool {
	return ctx.Err() == nil && raceCode(err) != "" && ownTransaction(db)
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

// nullVersion is the error of a row whose version column is NULL.
func (t *Table) nullVersion(key any) error {
	return sdk.Permanent(fmt.Errorf("%w: %s %s (column %s)", ErrNullVersion, t.name, sqlident.KeyText(key), t.version))
}

func (t *Table) wrap(ctx context.Context, key any, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return sdk.Permanent(fmt.Errorf("%w: %s %s", ErrNotFound, t.name, sqlident.KeyText(key)))
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if sqlident.DataException(err) { // a retry sends the same values
		return sdk.Permanent(fmt.Errorf("optimistic: %s %s: %w", t.name, sqlident.KeyText(key), sqlident.EscapedErr(err)))
	}
	return fmt.Errorf("optimistic: %s %s: %w", t.name, sqlident.KeyText(key), sqlident.EscapedErr(err))
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
	// Backoff, when positive, spaces the attempts: after the n-th conflict
	// Do waits a random duration in [0, Backoff·2^(n-1)) — full jitter, the
	// doubling capped at 64×Backoff — before the next attempt, and returns
	// ctx.Err() if ctx ends first. Zero (the default) retries at once: each
	// stale version means another update of the row landed, so the writers
	// as a whole make progress, but many writers of one hot row spend their
	// attempts colliding, and a statement that lost to a deadlock or a
	// serialization failure may meet the same transaction again.
	Backoff time.Duration

	conflicts atomic.Int64
}

// Do calls attempt until it returns something other than an error wrapping
// [ErrVersionConflict], at most MaxAttempts times. Each call of attempt must
// reload the row (its version included) and re-apply the change: re-sending
// the stale write can never succeed. When every try conflicts, Do returns the
// last conflict wrapped in an [*ExhaustedError] (still matching
// ErrVersionConflict); the error is transient: a later retry of the job
// reloads again. Between attempts Do checks ctx, and waits Backoff (with
// jitter) when set; a ctx that ends stops it with ctx.Err().
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
		if i < limit && r.Backoff > 0 {
			if err := sleep(ctx, rand.N(r.backoffCeiling(i))); err != nil {
				return err
			}
		}
	}
	return &ExhaustedError{Attempts: limit, Err: err}
}

// backoffCeiling is the bound of the wait after the n-th conflict:
// Backoff·2^(n-1), the doubling capped at 64×Backoff, and at the largest
// duration when that overflows. Backoff must be positive.
func (r *Retrier) backoffCeiling(n int) time.Duration {
	d := r.Backoff
	for range min(n-1, 6) {
		if d > math.MaxInt64/2 {
			return math.MaxInt64
		}
		d *= 2
	}
	return d
}

// sleep waits d, or until ctx ends (returning ctx.Err()).
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
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
