// Package pause pauses queues for every Worker of every process: operators
// record a pause in a shared PostgreSQL table ([PG], `berth queue pause`),
// and each Worker runs [Sync], which applies the table to the Worker's own
// [sdk.Worker.Pause] and [sdk.Worker.Resume].
//
// A paused queue gets no new receives from a synced Worker once its next
// sync ran (within the sync interval; a read that hangs is given up after
// the interval, at least 1s, and retried); deliveries already held run and
// settle as usual, and messages the broker took in ahead of Receive
// (RabbitMQ's consumer prefetch, [sdk.ReceiveStopper]) are handed back for
// the consumers still receiving. The broker itself is untouched: producers keep publishing, and a
// consumer that does not sync keeps consuming. While the table cannot be
// read, Sync keeps the pause state it last applied (it never resumes a queue
// because the database is down) and logs a warning. Until it has read the
// table once, it holds every queue of the Worker paused: a Worker started
// while the database is down runs nothing, rather than the queues the
// table pauses.
//
// See ARCHITECTURE.md, "Several queues per Worker".
package pause

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/internal/pgschema"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
)

// Paused is one paused queue.
type Paused struct {
	Queue string    `json:"queue"`
	Since time.Time `json:"since"`
}

// Lister lists the paused queues: what [Sync] reads.
type Lister interface {
	Paused(ctx context.Context) ([]Paused, error)
}

// DefaultSchema holds the pause table unless PGOptions.Schema says otherwise.
const DefaultSchema = "berth"

// PGOptions configures [NewPG].
type PGOptions struct {
	// Schema holds the table paused_queues. Default [DefaultSchema].
	Schema string
}

// PG keeps the paused queues in a PostgreSQL table, <schema>.paused_queues.
type PG struct {
	pool   *pgxpool.Pool
	name   string // the schema's name, for its migration lock (pgschema.Lock)
	schema string // quoted
	table  string
}

// ErrInvalidSchema reports a schema name that is not a plain identifier.
var ErrInvalidSchema = errors.New("berth/pause: invalid schema name")

// NewPG returns the pause table of pool. Call Migrate to create it.
func NewPG(pool *pgxpool.Pool, opts PGOptions) (*PG, error) {
	if pool == nil {
		return nil, errors.New("berth/pause: nil pool")
	}
	if opts.Schema == "" {
		opts.Schema = DefaultSchema
	}
	schema, err := sqlident.Column(opts.Schema) // a single identifier
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSchema, err)
	}
	return &PG{pool: pool, name: opts.Schema, schema: schema, table: schema + ".paused_queues"}, nil
}

// Migrate creates the schema and the table if they do not exist. It is
// safe to run from many processes at once (every Worker's process may run
// it as it starts): concurrent runs are serialised by a transaction-scoped
// advisory lock, since PostgreSQL's CREATE ... IF NOT EXISTS fails with a
// unique violation when another session creates the same object meanwhile.
// When the table exists it runs no DDL, so a role that may only read and
// write the table (USAGE on the schema; SELECT, INSERT, DELETE on
// paused_queues) can run it; creating the table needs the CREATE privilege.
func (s *PG) Migrate(ctx context.Context) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("berth/pause: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := pgschema.Lock(ctx, tx, s.name); err != nil {
		return fmt.Errorf("berth/pause: migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "berth.pause.migrate."+s.schema); err != nil {
		return fmt.Errorf("berth/pause: migrate: %w", err)
	}
	// Done already (every process that starts may run Migrate): no DDL.
	// PostgreSQL checks CREATE SCHEMA/TABLE IF NOT EXISTS for the CREATE
	// privilege (on the database, on the schema) before it finds the
	// object, so a role that may only read and write the table (an
	// operator's, an application's) failed here (pgschema.Present).
	done, err := pgschema.Present(ctx, tx, s.name, "paused_queues")
	if err != nil {
		return fmt.Errorf("berth/pause: migrate: %w", err)
	}
	if done {
		return nil
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+s.schema); err != nil {
		return fmt.Errorf("berth/pause: migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.table+` (
	queue     text        PRIMARY KEY,
	paused_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return fmt.Errorf("berth/pause: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("berth/pause: migrate: %w", err)
	}
	return nil
}

// Pause records queue as paused. It reports whether it was not paused
// already (pausing twice keeps the first time).
func (s *PG) Pause(ctx context.Context, queue string) (bool, error) {
	if err := sdk.ValidateQueueName(queue); err != nil {
		return false, err
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO `+s.table+` (queue) VALUES ($1) ON CONFLICT DO NOTHING`, queue)
	if err != nil {
		return false, fmt.Errorf("berth/pause: pause %q: %w", queue, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Resume removes queue's pause. It reports whether the queue was paused.
func (s *PG) Resume(ctx context.Context, queue string) (bool, error) {
	if !sqlident.StorableText(queue) {
		// No row holds it (Pause refuses it) and PostgreSQL would refuse
		// the statement: the caller's error, not the database's.
		return false, &sdk.QueueNameError{Name: queue, Reason: "not text PostgreSQL can store"}
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.table+` WHERE queue = $1`, queue)
	if err != nil {
		return false, fmt.Errorf("berth/pause: resume %q: %w", queue, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Paused lists the paused queues, by name. A row whose paused_at is not a
// finite time (written by hand: 'infinity') is listed with a zero Since:
// the pause is what counts, and one such row must not fail every read (and
// with it every Sync).
func (s *PG) Paused(ctx context.Context) ([]Paused, error) {
	rows, err := s.pool.Query(ctx, `SELECT queue, CASE WHEN isfinite(paused_at) THEN paused_at END FROM `+s.table+` ORDER BY queue`)
	if err != nil {
		return nil, fmt.Errorf("berth/pause: list: %w", err)
	}
	defer rows.Close()
	var out []Paused
	for rows.Next() {
		var p Paused
		var since *time.Time
		if err := rows.Scan(&p.Queue, &since); err != nil {
			return nil, fmt.Errorf("berth/pause: list: %w", err)
		}
		if since != nil {
			p.Since = *since
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("berth/pause: list: %w", err)
	}
	return out, nil
}

// minReadTimeout is the least time [Sync] gives a read of the table,
// however short its Interval.
const minReadTimeout = time.Second

// SyncOptions configures [Sync].
type SyncOptions struct {
	// Interval between reads of the table. Default 5s. It also bounds
	// each read (at least 1s): a read that takes longer is a failed read.
	Interval time.Duration
	// Logger receives the pauses and resumes applied (Info) and failed reads
	// (Warn). Default slog.Default().
	Logger *slog.Logger
	// FailOpen runs the Worker's queues before the table was first read,
	// instead of holding them all paused: a Worker started while the
	// database is down then runs the queues the table pauses, until the
	// first read pauses them. For Workers that must keep running through an
	// outage of a database they do not otherwise need.
	FailOpen bool
}

// Sync applies the paused queues of l to w now and then every Interval,
// until ctx is done; it returns nil then (see below for a ctx done
// already). It owns the pause state of w's
// queues: a queue paused with w.Pause but not in l is resumed at the next
// sync. A failed read keeps the state last applied. Before its first
// successful read Sync pauses every queue of w (failing closed, unless
// opts.FailOpen), warning at each failed read; the first read resumes the
// queues l does not pause. The hold starts each time Sync does (a Sync
// restarted on a running Worker during an outage stops it too): to have it
// before w.Run's first receive, pause w's queues before starting both
// (Sync's first read resumes them).
//
// A Sync whose ctx ends before any read succeeded never learnt what l
// pauses: it resumes the queues it held itself (those the caller had
// paused stay paused), leaving w as it found it. With ctx done already,
// Sync does not start: it returns ctx's error (wrapped) at once, touching
// nothing.
func Sync(ctx context.Context, w *sdk.Worker, l Lister, opts SyncOptions) error {
	if w == nil || l == nil {
		return errors.New("berth/pause: Sync needs a Worker and a Lister")
	}
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("berth/pause: Sync: %w", err)
	}
	// Until the table was read, hold every queue: what it pauses is unknown.
	// own are the queues the hold paused (not paused already): what a Sync
	// ending before its first read resumes.
	var held, own map[string]bool
	if !opts.FailOpen {
		held, own = map[string]bool{}, map[string]bool{}
		for _, q := range w.Queues() {
			was := w.Paused(q)
			if w.Pause(q) == nil {
				held[q] = true
				own[q] = !was
			}
		}
	}
	read := false
	tick := time.NewTicker(opts.Interval)
	defer tick.Stop()
	// Each read is bounded: a read that never answers (a frozen database
	// host, a black-holed connection) would otherwise stop the syncing
	// for as long as its TCP connection lives. One that outlasts the
	// interval is a failed read; the next goes out at the next tick.
	readTimeout := max(opts.Interval, minReadTimeout)
	for {
		rctx, rcancel := context.WithTimeout(ctx, readTimeout)
		err := apply(rctx, w, l, opts.Logger, held)
		rcancel()
		if err != nil {
			if ctx.Err() == nil && held != nil {
				opts.Logger.Warn("berth/pause: the paused queues were never read; every queue stays paused until they are",
					"queues", w.Queues(), "err", err)
			} else if ctx.Err() == nil {
				opts.Logger.Warn("berth/pause: reading the paused queues failed; keeping the current state", "err", err)
			}
		} else {
			held, read = nil, true
		}
		select {
		case <-ctx.Done():
			if read {
				return nil
			}
			// Never read: hand back the hold (see the doc comment).
			var resumed []string
			for q, mine := range own {
				if mine && w.Resume(q) == nil {
					resumed = append(resumed, q)
				}
			}
			if len(resumed) > 0 {
				slices.Sort(resumed)
				opts.Logger.Info("berth/pause: Sync ended before reading the paused queues; the queues it held are resumed", "queues", resumed)
			}
			return nil
		case <-tick.C:
		}
	}
}

// apply reads l once and pauses or resumes w's queues to match. The
// resume of a queue in held (paused by Sync until the first read) is not
// logged.
func apply(ctx context.Context, w *sdk.Worker, l Lister, log *slog.Logger, held map[string]bool) error {
	ps, err := l.Paused(ctx)
	if err != nil {
		return err
	}
	paused := make(map[string]bool, len(ps))
	for _, p := range ps {
		paused[p.Queue] = true
	}
	for _, q := range w.Queues() {
		switch want, is := paused[q], w.Paused(q); {
		case want && !is:
			if w.Pause(q) == nil {
				log.Info("berth/pause: queue paused", "queue", q)
			}
		case want && held[q]:
			log.Info("berth/pause: queue paused", "queue", q)
		case !want && is:
			if w.Resume(q) == nil && !held[q] {
				log.Info("berth/pause: queue resumed", "queue", q)
			}
		}
	}
	return nil
}

// PausedSince returns the paused queues and the time of their pause: the
// form the dashboard (dashboard.Pauses) reads.
func (s *PG) PausedSince(ctx context.Context) (map[string]time.Time, error) {
	ps, err := s.Paused(ctx)
	if err != nil {
		return nil, err
	}
	m := make(map[string]time.Time, len(ps))
	for _, p := range ps {
		m[p.Queue] = p.Since
	}
	return m, nil
}
