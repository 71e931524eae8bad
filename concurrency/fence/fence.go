// Package fence makes a database write check a fencing token, so that a lock
// holder that lost its lock without noticing (paused past the lock's TTL)
// cannot overwrite the work of the holder that came after it.
//
// The guarded table has a token column (bigint, NULL at first). A fenced write
// records its token and succeeds only when no later token has written:
//
//	UPDATE accounts SET balance = $3, fence_token = $2
//	 WHERE id = $1 AND (fence_token IS NULL OR fence_token <= $2)
//
// Tokens come from package redislock ([redislock.Lock.Token]); any source of
// strictly increasing tokens per resource works. The check uses <= rather
// than <: a token belongs to one holder only, so the same holder may write
// several times, while every earlier holder is refused. Run the fenced write
// in the transaction that makes the rest of the job's effect: the row lock it
// takes then fences the whole transaction.
//
// A token orders writes; it does not fence a read made before it is
// recorded. In a read-modify-write, a holder that reads the row and then
// makes a fenced write can lose an update: the earlier holder, paused past
// its lock's TTL, writes between that read and the fenced write (no later
// token has written yet, so its write is accepted), and the fenced write,
// computed from the read before it, overwrites it. Take the token first:
//
//	tx: Check(row, token) → read the row → Update(row, token, new values) → commit
//
// Check records the token and locks the row until commit, so an earlier
// holder's write either came before it (and the read sees it) or is
// refused ([ErrStaleToken]).
package fence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/berthq/berth/internal/notfound"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrStaleToken reports a write refused because a later token already
	// wrote the row: the writer's lock was lost. It is transient for the job
	// (a retry takes a fresh lock and a fresh token), and the work done under
	// the stale token must be discarded (roll the transaction back).
	ErrStaleToken = errors.New("fence: stale fencing token")
	// ErrNotFound reports that no row has the key (a string key
	// PostgreSQL cannot store — a NUL byte, invalid UTF-8 — is answered
	// so without a query, leaving a transaction usable). It matches
	// sdk.ErrNotFound too, and arrives wrapped in sdk.Permanent: a job about
	// a row that does not exist cannot succeed (the same convention in every
	// concurrency package; ARCHITECTURE.md, "Error classes").
	ErrNotFound = notfound.New("fence: row not found")
)

// StaleTokenError describes a refused write. It wraps [ErrStaleToken].
type StaleTokenError struct {
	Table   string
	Key     any
	Token   int64 // the refused token
	Current int64 // the token the row holds
}

// Error describes the refused write.
func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("fence: %s %s: token %d refused, row holds %d", e.Table, sqlident.KeyText(e.Key), e.Token, e.Current)
}

// Unwrap returns ErrStaleToken.
func (e *StaleTokenError) Unwrap() error { return ErrStaleToken }

// DB is what the statements run on: a pgx.Tx, *pgx.Conn or *pgxpool.Pool.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Options configure a [Table].
type Options struct {
	// Table name, optionally schema-qualified. Required. Validated and quoted.
	Table string
	// KeyColumn identifies the row. Default "id".
	KeyColumn string
	// TokenColumn holds the last token that wrote the row, a nullable
	// bigint. Default "fence_token".
	TokenColumn string
}

// Table runs fenced writes on one table. It is safe for concurrent use.
type Table struct {
	name  string
	table string
	key   string
	token string
}

// New validates opts and returns a Table.
func New(opts Options) (*Table, error) {
	t := &Table{name: opts.Table}
	var err error
	if t.table, t.key, t.token, err = sqlident.Keyed(opts.Table, opts.KeyColumn, opts.TokenColumn, "fence_token"); err != nil {
		return nil, fmt.Errorf("fence: %w", err)
	}
	return t, nil
}

// Check records token on the row whose key is key, provided no later token
// has; it writes nothing else. Run it first in a transaction whose reads and
// other writes the token should fence (see the package doc). A later token
// gives a [*StaleTokenError] ([ErrStaleToken]); a missing row a permanent [ErrNotFound]; a key or
// value PostgreSQL cannot read (a data exception, SQLSTATE class 22) a
// permanent error wrapping PostgreSQL's.
func (t *Table) Check(ctx context.Context, db DB, key any, token int64) error {
	return t.Update(ctx, db, key, token, nil)
}

// Update sets the columns in set, and the token, on the row whose key is key,
// provided no later token has written it. Errors as for [Table.Check]. Column
// names are validated and quoted; values are bind parameters.
func (t *Table) Update(ctx context.Context, db DB, key any, token int64, set map[string]any) error {
	names := make([]string, 0, len(set))
	for c := range set {
		names = append(names, c)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString("UPDATE " + t.table + " SET ")
	args := make([]any, 2, 2+len(names))
	args[0], args[1] = key, token
	for _, c := range names {
		q, err := sqlident.Column(c)
		if err != nil {
			return fmt.Errorf("fence: %w", err)
		}
		if q == t.key || q == t.token {
			return fmt.Errorf("fence: set names the key or token column %q", c)
		}
		args = append(args, set[c])
		b.WriteString(q + " = $" + strconv.Itoa(len(args)) + ", ")
	}
	if sqlident.UnstorableKey(key) {
		return t.wrap(ctx, key, pgx.ErrNoRows) // no row holds it
	}
	b.WriteString(t.token + " = $2 WHERE " + t.key + " = $1 AND (" + t.token + " IS NULL OR " + t.token + " <= $2)")
	tag, err := db.Exec(ctx, b.String(), args...)
	if err != nil {
		return t.wrap(ctx, key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var current *int64
	if err := db.QueryRow(ctx, "SELECT "+t.token+" FROM "+t.table+" WHERE "+t.key+" = $1", key).Scan(&current); err != nil {
		return t.wrap(ctx, key, err)
	}
	if current == nil { // cannot refuse a NULL token; the row moved under us
		return fmt.Errorf("fence: %s %s: write matched no row", t.name, sqlident.KeyText(key))
	}
	return &StaleTokenError{Table: t.name, Key: key, Token: token, Current: *current}
}

func (t *Table) wrap(ctx context.Context, key any, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return sdk.Permanent(fmt.Errorf("%w: %s %s", ErrNotFound, t.name, sqlident.KeyText(key)))
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if sqlident.DataException(err) { // a retry sends the same values
		return sdk.Permanent(fmt.Errorf("fence: %s %s: %w", t.name, sqlident.KeyText(key), sqlident.EscapedErr(err)))
	}
	return fmt.Errorf("fence: %s %s: %w", t.name, sqlident.KeyText(key), sqlident.EscapedErr(err))
}
