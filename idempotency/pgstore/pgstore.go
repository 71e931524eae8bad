// Package pgstore is the PostgreSQL idempotency store: the job_results table
// of berth's reference schema, whose unique idempotency_key is the fence
// against double side effects. It implements both modes of the idempotency
// guard: transactional (the key row, the handler's writes and the result in
// one transaction — handlers find it with [TxFrom]) and lease (claims with an
// expiry, taken over atomically once expired).
//
// Create the table with [Store.Migrate], or apply the SQL of [SQL] (schema.sql
// holds it for the default names) with your migration tool.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/internal/pgretry"
	"github.com/berthq/berth/internal/pgschema"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the store needs of a connection pool; *pgxpool.Pool and
// *pgx.Conn (used by one goroutine) satisfy it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Options names the table. The zero value is public.job_results.
type Options struct {
	// Schema holding the table. Default "public".
	Schema string
	// Table name. Default "job_results".
	Table string
}

// Default names.
const (
	DefaultSchema = "public"
	DefaultTable  = "job_results"
)

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

func (o Options) withDefaults() (Options, error) {
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	for _, id := range []string{o.Schema, o.Table} {
		if !identRE.MatchString(id) {
			return o, fmt.Errorf("%w: identifier %q: want 1-40 of [a-z0-9_], not starting with a digit", idempotency.ErrInvalidConfig, id)
		}
	}
	return o, nil
}

// Store is a PostgreSQL [idempotency.TxStore]. It is safe for concurrent use.
type Store struct {
	db    DB
	opts  Options
	table string // quoted schema.table
	q     queries
}

var _ idempotency.TxStore = (*Store)(nil)

type queries struct {
	insertTx, claim, selectRow, complete, release, extend, finishTx, deleteExpired string
}

// New returns a store on db. It does not touch the database; call
// [Store.Migrate] to create the table.
func New(db DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil DB", idempotency.ErrInvalidConfig)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	t := pgx.Identifier{opts.Schema, opts.Table}.Sanitize()
	s := &Store{db: db, opts: opts, table: t}
	// The claim's time left (µs) comes from the database's clock, the one
	// that decides its expiry, not the worker's.
	const cols = `idempotency_key, job_type, fingerprint, status, resource_type, resource_id, result_json::text, owner_token, locked_until, takeovers, completed_at, expires_at,
(extract(epoch FROM locked_until - now()) * 1000000)::bigint`
	s.q = queries{
		insertTx: `INSERT INTO ` + t + ` (idempotency_key, job_type, fingerprint, status, completed_at, expires_at)
VALUES ($1, $2, $3, 'completed', now(), now() + make_interval(secs => $4))
ON CONFLICT (idempotency_key) DO NOTHING`,
		claim: `INSERT INTO ` + t + ` AS r (idempotency_key, job_type, fingerprint, status, owner_token, locked_until, expires_at)
VALUES ($1, $2, $3, 'in_progress', $4, now() + make_interval(secs => $5), now() + make_interval(secs => $5 + $6))
ON CONFLICT (idempotency_key) DO UPDATE
SET owner_token = EXCLUDED.owner_token, locked_until = EXCLUDED.locked_until,
    expires_at = EXCLUDED.expires_at, takeovers = r.takeovers + 1
WHERE r.status = 'in_progress' AND r.locked_until <= now() AND r.fingerprint = EXCLUDED.fingerprint
RETURNING (xmax = 0)`,
		selectRow: `SELECT ` + cols + ` FROM ` + t + ` WHERE idempotency_key = $1`,
		// The owner token stays on the completed row, so that a completion
		// repeated after its answer was lost finds its own and succeeds (the
		// outer EXISTS reads the row as it was before the UPDATE).
		complete: `WITH done AS (UPDATE ` + t + ` SET status = 'completed', resource_type = $3, resource_id = $4, result_json = $5::jsonb,
locked_until = NULL, completed_at = now(), expires_at = now() + make_interval(secs => $6)
WHERE idempotency_key = $1 AND owner_token = $2 AND status = 'in_progress' RETURNING 1)
SELECT EXISTS (SELECT 1 FROM done) OR EXISTS (SELECT 1 FROM ` + t + ` WHERE idempotency_key = $1 AND owner_token = $2 AND status = 'completed')`,
		release: `DELETE FROM ` + t + ` WHERE idempotency_key = $1 AND owner_token = $2 AND status = 'in_progress'`,
		extend: `UPDATE ` + t + ` SET locked_until = now() + make_interval(secs => $3)
WHERE idempotency_key = $1 AND owner_token = $2 AND status = 'in_progress'`,
		// A transactional key row completes at the commit, not at the
		// transaction's start (now()): its retention counts from then.
		finishTx: `UPDATE ` + t + ` SET resource_type = $2, resource_id = $3, result_json = $4::jsonb,
completed_at = c.at, expires_at = c.at + make_interval(secs => $5)
FROM (SELECT clock_timestamp() AS at) c WHERE idempotency_key = $1`,
		deleteExpired: `DELETE FROM ` + t + ` WHERE idempotency_key IN (
SELECT idempotency_key FROM ` + t + ` WHERE expires_at < now() AND (status = 'completed' OR locked_until < now())
LIMIT $1 FOR UPDATE SKIP LOCKED)`,
	}
	return s, nil
}

// Table returns the quoted, schema-qualified table name.
func (s *Store) Table() string { return s.table }

// SQL returns the DDL of the table (and its schema and retention index) for
// opts, with validated, quoted identifiers. It is idempotent (IF NOT EXISTS).
func SQL(opts Options) (string, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return "", err
	}
	t := pgx.Identifier{opts.Schema, opts.Table}.Sanitize()
	idx := pgx.Identifier{opts.Table + "_expires_at_idx"}.Sanitize()
	return `CREATE SCHEMA IF NOT EXISTS ` + pgx.Identifier{opts.Schema}.Sanitize() + `;
CREATE TABLE IF NOT EXISTS ` + t + ` (
    idempotency_key text        NOT NULL PRIMARY KEY,
    job_type        text        NOT NULL DEFAULT '',
    fingerprint     text        NOT NULL DEFAULT '',
    status          text        NOT NULL CHECK (status IN ('in_progress', 'completed')),
    resource_type   text,
    resource_id     text,
    result_json     jsonb,
    owner_token     text,
    locked_until    timestamptz,
    takeovers       integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    expires_at      timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + t + ` (expires_at);
`, nil
}

// Migrate creates the table if it does not exist. Concurrent calls are
// serialised by an advisory lock. On a table already made it runs no DDL
// and takes no lock on the table: a process starting while handlers write
// to it does not stall them.
func (s *Store) Migrate(ctx context.Context) error {
	ddl, err := SQL(s.opts)
	if err != nil {
		return err
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := pgschema.Lock(ctx, tx, s.opts.Schema); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "berth.idempotency."+s.table); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	// Done already (every process that starts runs Migrate): no DDL, so no
	// lock on the table, which handlers write in their transactions
	// (pgschema.Present). A later version that alters what exists must
	// check for its change here too.
	done, err := pgschema.Present(ctx, tx, s.opts.Schema, s.opts.Table, s.opts.Table+"_expires_at_idx")
	if err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	if done {
		return nil
	}
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	return nil
}

type txKey struct{}

// TxFrom returns the transaction a transactional-mode handler must write
// through: its writes commit together with the idempotency key, or not at all.
// Handlers must not commit or roll it back.
func TxFrom(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

type tx struct {
	s         *Store
	tx        pgx.Tx
	key       string
	retention time.Duration
}

func (t *tx) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, t.tx)
}

// Commit stores r and the completion time with the key, then commits: the
// row's retention counts from the completion, however long the handler ran.
func (t *tx) Commit(ctx context.Context, r idempotency.Result) error {
	if _, err := t.tx.Exec(ctx, t.s.q.finishTx, t.key, nullable(r.ResourceType), nullable(r.ResourceID), jsonArg(r.JSON), t.retention.Seconds()); err != nil {
		return err
	}
	return t.tx.Commit(ctx)
}

func (t *tx) Rollback(ctx context.Context) error {
	err := t.tx.Rollback(ctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}

// Begin implements [idempotency.TxStore]: BEGIN (repeated a few times when
// it fails on a lost connection), then INSERT of the key row (as completed:
// nobody sees it before the commit). A concurrent Begin of the
// same key blocks on the unique index until this transaction ends.
func (s *Store) Begin(ctx context.Context, c idempotency.Claim) (idempotency.Tx, idempotency.Outcome, *idempotency.Record, error) {
	// A BEGIN on a connection the server dropped (the pool still held it)
	// fails without doing anything: take another connection, a few times,
	// rather than fail the job and spend one of its attempts.
	var ptx pgx.Tx
	err := pgretry.Do(ctx, func(ctx context.Context) error {
		var err error
		ptx, err = s.db.Begin(ctx)
		return err
	})
	if err != nil {
		return nil, 0, nil, fmt.Errorf("pgstore: begin: %w", err)
	}
	for range 3 {
		tag, err := ptx.Exec(ctx, s.q.insertTx, c.Key, c.JobType, c.Fingerprint, c.Retention.Seconds())
		if err != nil {
			_ = ptx.Rollback(context.WithoutCancel(ctx))
			return nil, 0, nil, unstorable(fmt.Errorf("pgstore: insert key: %w", err), c.Key)
		}
		if tag.RowsAffected() == 1 {
			return &tx{s: s, tx: ptx, key: c.Key, retention: c.Retention}, idempotency.Acquired, nil, nil
		}
		rec, err := s.get(ctx, ptx, c.Key)
		if errors.Is(err, idempotency.ErrNotFound) {
			continue // released or purged in between: insert again
		}
		_ = ptx.Rollback(context.WithoutCancel(ctx))
		if err != nil {
			return nil, 0, nil, err
		}
		return nil, outcomeOf(rec), rec, nil
	}
	_ = ptx.Rollback(context.WithoutCancel(ctx))
	return nil, 0, nil, fmt.Errorf("pgstore: key_sha256 %s keeps appearing and vanishing; try again", idempotency.KeyDigest(c.Key))
}

// Claim implements [idempotency.Store] with one INSERT … ON CONFLICT DO
// UPDATE … WHERE: the takeover condition is re-checked on the locked row, so
// of many concurrent claimers of an expired claim exactly one wins.
func (s *Store) Claim(ctx context.Context, c idempotency.Claim) (idempotency.Outcome, *idempotency.Record, error) {
	for range 3 {
		var inserted bool
		err := s.db.QueryRow(ctx, s.q.claim, c.Key, c.JobType, c.Fingerprint, c.Owner, c.Lease.Seconds(), c.Retention.Seconds()).Scan(&inserted)
		switch {
		case err == nil && inserted:
			return idempotency.Acquired, nil, nil
		case err == nil:
			return idempotency.TakenOver, nil, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return 0, nil, unstorable(fmt.Errorf("pgstore: claim: %w", err), c.Key)
		}
		rec, err := s.get(ctx, s.db, c.Key)
		if errors.Is(err, idempotency.ErrNotFound) {
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		return outcomeOf(rec), rec, nil
	}
	return 0, nil, fmt.Errorf("pgstore: key_sha256 %s keeps appearing and vanishing; try again", idempotency.KeyDigest(c.Key))
}

// Complete implements [idempotency.Store]: one statement that completes the
// claim, or finds it completed by the same owner (a retry after a lost
// answer).
func (s *Store) Complete(ctx context.Context, c idempotency.Claim, r idempotency.Result) error {
	var ok bool
	if err := s.db.QueryRow(ctx, s.q.complete, c.Key, c.Owner, nullable(r.ResourceType), nullable(r.ResourceID), jsonArg(r.JSON), c.Retention.Seconds()).Scan(&ok); err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	if !ok {
		return fmt.Errorf("pgstore: complete key_sha256 %s: %w", idempotency.KeyDigest(c.Key), idempotency.ErrClaimLost)
	}
	return nil
}

// Release implements [idempotency.Store].
func (s *Store) Release(ctx context.Context, c idempotency.Claim) error {
	tag, err := s.db.Exec(ctx, s.q.release, c.Key, c.Owner)
	return fenced(tag, err, "release", c.Key)
}

// Extend implements [idempotency.Store].
func (s *Store) Extend(ctx context.Context, c idempotency.Claim, d time.Duration) error {
	tag, err := s.db.Exec(ctx, s.q.extend, c.Key, c.Owner, d.Seconds())
	return fenced(tag, err, "extend", c.Key)
}

// Get implements [idempotency.Store]. A key PostgreSQL's text cannot hold
// (a NUL byte, invalid UTF-8), which [Store.Claim] and [Store.Begin] refuse
// with [idempotency.ErrInvalidKey], is in no row: Get returns an error
// wrapping both [idempotency.ErrNotFound] and ErrInvalidKey without sending
// the statement, which PostgreSQL would fail (SQLSTATE 22021, aborting the
// transaction when the Store's DB is one).
func (s *Store) Get(ctx context.Context, key string) (*idempotency.Record, error) {
	if !sqlident.StorableText(key) {
		return nil, fmt.Errorf("pgstore: get key_sha256 %s: %w (%w)", idempotency.KeyDigest(key), idempotency.ErrNotFound, idempotency.ErrInvalidKey)
	}
	return s.get(ctx, s.db, key)
}

// DeleteExpired implements [idempotency.Store]: one DELETE of at most limit
// rows past their retention (live claims excepted), skipping rows locked by
// another transaction.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	tag, err := s.db.Exec(ctx, s.q.deleteExpired, limit)
	if err != nil {
		return 0, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) get(ctx context.Context, q rowQuerier, key string) (*idempotency.Record, error) {
	var (
		r                          idempotency.Record
		status                     string
		rtype, rid, res, owner     *string
		locked, completed, expires *time.Time
		lockedFor                  *int64 // µs
	)
	err := q.QueryRow(ctx, s.q.selectRow, key).Scan(&r.Key, &r.JobType, &r.Fingerprint, &status, &rtype, &rid, &res, &owner, &locked, &r.Takeovers, &completed, &expires, &lockedFor)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, idempotency.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("pgstore: get key: %w", err)
	}
	r.Status = idempotency.Status(status)
	r.Result.ResourceType = deref(rtype)
	r.Result.ResourceID = deref(rid)
	if res != nil {
		r.Result.JSON = []byte(*res)
	}
	r.Owner = deref(owner)
	if lockedFor != nil && r.Status == idempotency.StatusInProgress {
		r.LockedFor = time.Duration(*lockedFor) * time.Microsecond
	}
	for _, p := range []struct {
		dst *time.Time
		src *time.Time
	}{{&r.LockedUntil, locked}, {&r.CompletedAt, completed}, {&r.ExpiresAt, expires}} {
		if p.src != nil {
			*p.dst = *p.src
		}
	}
	return &r, nil
}

// unstorable makes err, from the statement that inserts a claim's key row,
// a permanent error wrapping [idempotency.ErrInvalidKey] when PostgreSQL
// refused the values themselves: a data exception (SQLSTATE class 22: a NUL
// byte or invalid UTF-8 in the key, job type or fingerprint) or a program
// limit (54000: a key too long for the unique index). Every retry would fail
// the same way. Other errors are returned as they are (transient).
func unstorable(err error, key string) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || (!strings.HasPrefix(pe.Code, "22") && pe.Code != "54000") {
		return err
	}
	return sdk.Permanent(fmt.Errorf("pgstore: key_sha256 %s: %w: %w", idempotency.KeyDigest(key), idempotency.ErrInvalidKey, err))
}

func outcomeOf(r *idempotency.Record) idempotency.Outcome {
	if r.Status == idempotency.StatusCompleted {
		return idempotency.Completed
	}
	return idempotency.InProgress
}

func fenced(tag pgconn.CommandTag, err error, op, key string) error {
	if err != nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: %s key_sha256 %s: %w", op, idempotency.KeyDigest(key), idempotency.ErrClaimLost)
	}
	return nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func jsonArg(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
