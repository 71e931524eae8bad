// Package rowlock locks one database row with SELECT … FOR UPDATE inside the
// caller's pgx transaction, with a bound on how long it waits.
//
// A row that another transaction holds longer than the bound is busy, not
// broken: [Locker.Lock] then returns an error built by [sdk.RetryAfter] (it
// wraps [ErrBusy] and a [*BusyError]), which the Worker turns into a delayed
// redelivery that does not consume an attempt. The time spent waiting for the
// lock is returned and, when [Options.Observe] is set, reported.
//
// PostgreSQL aborts the transaction whose lock wait timed out: after a busy
// error, roll the transaction back and return the error from the handler.
//
// A row lock serialises writers of one row for the length of a transaction; it
// lasts no longer than the transaction, so it cannot be lost while the
// transaction is open. That is what makes it a correctness tool, unlike a Redis
// lock (see package redislock).
package rowlock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/berthq/berth/internal/notfound"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrBusy reports a row locked by another transaction beyond the wait bound
	// (or at once, with NoWait). It arrives wrapped in sdk.RetryAfter.
	ErrBusy = errors.New("rowlock: row busy")
	// ErrNotFound reports that no row has the key (a string key
	// PostgreSQL cannot store — a NUL byte, invalid UTF-8 — is answered
	// so without a query, leaving a transaction usable). It matches
	// sdk.ErrNotFound too, and arrives wrapped in sdk.Permanent: a job about
	// a row that does not exist cannot succeed (the same convention in every
	// concurrency package; ARCHITECTURE.md, "Error classes").
	ErrNotFound = notfound.New("rowlock: row not found")
)

// BusyError describes a lock that was not obtained. It wraps [ErrBusy] and the
// driver error (SQLSTATE 55P03, lock_not_available).
type BusyError struct {
	Table  string
	Key    any
	Waited time.Duration // how long the statement waited before giving up
	Err    error
}

// Error describes the busy resource.
func (e *BusyError) Error() string {
	return fmt.Sprintf("rowlock: row %s of %s busy after %s", sqlident.KeyText(e.Key), e.Table, e.Waited.Round(time.Microsecond))
}

// Unwrap returns ErrBusy and the driver error.
func (e *BusyError) Unwrap() []error { return []error{ErrBusy, e.Err} }

// Options configure a [Locker]. The zero value of every field but Table is a
// sensible default.
type Options struct {
	// Table holding the rows, optionally schema-qualified ("billing.orders").
	// Required. Validated and quoted.
	Table string
	// KeyColumn identifies the row. Default "id".
	KeyColumn string
	// Columns are read from the locked row into Lock's dest arguments, in
	// this order. Empty: nothing is read.
	Columns []string
	// Timeout bounds the wait for the lock (PostgreSQL lock_timeout, set
	// with SET LOCAL for the locking statement only, then put back).
	// Default 2s, at most about 24.8 days (2^31-1 ms, PostgreSQL's
	// largest lock_timeout). Ignored with NoWait.
	Timeout time.Duration
	// NoWait fails at once when the row is locked (FOR UPDATE NOWAIT).
	NoWait bool
	// RetryDelay is the delay put in the RetryAfter error when the row is
	// busy. Default 1s.
	RetryDelay time.Duration
	// Observe, when set, is called after every Lock with the table, the time
	// spent in the locking statement and its error (nil on success). Use it
	// for a row-lock wait-time metric. It must be quick and safe for
	// concurrent use.
	Observe func(ctx context.Context, table string, waited time.Duration, err error)
}

// maxTimeout is the largest lock_timeout PostgreSQL accepts: 2^31-1 ms.
const maxTimeout = math.MaxInt32 * time.Millisecond

// Locker locks rows of one table. It is safe for concurrent use.
type Locker struct {
	table      string // as given, for errors and Observe
	query      string
	timeout    string // lock_timeout value, e.g. "2000ms"
	noWait     bool
	retryDelay time.Duration
	observe    func(context.Context, string, time.Duration, error)
}

// New validates opts and returns a Locker.
func New(opts Options) (*Locker, error) {
	table, err := sqlident.Table(opts.Table)
	if err != nil {
		return nil, fmt.Errorf("rowlock: %w", err)
	}
	if opts.KeyColumn == "" {
		opts.KeyColumn = "id"
	}
	key, err := sqlident.Column(opts.KeyColumn)
	if err != nil {
		return nil, fmt.Errorf("rowlock: %w", err)
	}
	cols, err := sqlident.Columns(opts.Columns)
	if err != nil {
		return nil, fmt.Errorf("rowlock: %w", err)
	}
	if opts.Timeout < 0 || opts.RetryDelay < 0 {
		return nil, errors.New("rowlock: negative Timeout or RetryDelay")
	}
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Second
	}
	if opts.Timeout < time.Millisecond {
		return nil, errors.New("rowlock: Timeout under 1ms (lock_timeout counts milliseconds)")
	}
	if opts.Timeout > maxTimeout && !opts.NoWait {
		// PostgreSQL refuses a larger lock_timeout: every Lock would fail.
		return nil, fmt.Errorf("rowlock: Timeout %s over %s (lock_timeout's largest value)", opts.Timeout, maxTimeout)
	}
	if opts.RetryDelay == 0 {
		opts.RetryDelay = time.Second
	}
	sel := "1"
	if len(cols) > 0 {
		sel = strings.Join(cols, ", ")
	}
	q := "SELECT " + sel + " FROM " + table + " WHERE " + key + " = $1 FOR UPDATE"
	if opts.NoWait {
		q += " NOWAIT"
	}
	return &Locker{
		table:      opts.Table,
		query:      q,
		timeout:    fmt.Sprintf("%dms", opts.Timeout.Milliseconds()),
		noWait:     opts.NoWait,
		retryDelay: opts.RetryDelay,
		observe:    opts.Observe,
	}, nil
}

// Lock locks the row whose key column equals key, in tx, until tx ends, and
// scans the configured Columns into dest (give exactly len(Columns) targets).
// It returns the time spent in the locking statement.
//
// A busy row gives an error made by sdk.RetryAfter wrapping a [*BusyError]
// ([ErrBusy]); tx is then aborted and must be rolled back. A missing row
// gives a permanent [ErrNotFound], and a key the key column's type cannot
// read (a data exception, SQLSTATE class 22) a permanent error wrapping
// PostgreSQL's. Context errors are returned unwrapped.
func (l *Locker) Lock(ctx context.Context, tx pgx.Tx, key any, dest ...any) (time.Duration, error) {
	waited, err := l.lock(ctx, tx, key, dest)
	if l.observe != nil {
		l.observe(ctx, l.table, waited, err)
	}
	return waited, err
}

func (l *Locker) lock(ctx context.Context, tx pgx.Tx, key any, dest []any) (time.Duration, error) {
	if sqlident.UnstorableKey(key) {
		return 0, l.classify(ctx, key, 0, pgx.ErrNoRows) // no row holds it
	}
	if len(dest) == 0 {
		var one int
		dest = []any{&one}
	}
	if l.noWait {
		start := time.Now()
		err := tx.QueryRow(ctx, l.query, key).Scan(dest...)
		waited := time.Since(start)
		return waited, l.classify(ctx, key, waited, err)
	}
	// Read the transaction's lock_timeout and set ours in one round trip;
	// the lock and the restore go in a second one, which is what we time.
	var prev string
	b := &pgx.Batch{}
	b.Queue("SELECT current_setting('lock_timeout')").QueryRow(func(r pgx.Row) error { return r.Scan(&prev) })
	b.Queue("SELECT set_config('lock_timeout', $1, true)", l.timeout)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, l.classify(ctx, key, 0, err)
	}
	b = &pgx.Batch{}
	var lockErr error
	b.Queue(l.query, key).QueryRow(func(r pgx.Row) error { lockErr = r.Scan(dest...); return lockErr })
	b.Queue("SELECT set_config('lock_timeout', $1, true)", prev)
	start := time.Now()
	err := tx.SendBatch(ctx, b).Close()
	waited := time.Since(start)
	if lockErr != nil {
		err = lockErr
	}
	return waited, l.classify(ctx, key, waited, err)
}

func (l *Locker) classify(ctx context.Context, key any, waited time.Duration, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return sdk.Permanent(fmt.Errorf("%w: %s %s", ErrNotFound, l.table, sqlident.KeyText(key)))
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available
		return sdk.RetryAfter(&BusyError{Table: l.table, Key: key, Waited: waited, Err: err}, l.retryDelay)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if sqlident.DataException(err) { // a retry sends the same key
		return sdk.Permanent(fmt.Errorf("rowlock: lock %s %s: %w", l.table, sqlident.KeyText(key), sqlident.EscapedErr(err)))
	}
	return fmt.Errorf("rowlock: lock %s %s: %w", l.table, sqlident.KeyText(key), sqlident.EscapedErr(err))
}
