// Package outbox is the transactional outbox: messages are written to a table
// in the same PostgreSQL transaction as the business change that causes them,
// and a relay publishes them to any [sdk.Publisher] after that transaction
// commits. A message exists if and only if the business change committed; no
// change is published that was rolled back, and none is lost when the process
// dies between its commit and the publish.
//
// The relay publishes at least once: if it dies after the broker accepted a
// batch but before it deleted the rows, the batch is published again, with
// the same message IDs and idempotency keys, which consumers dedupe on (see
// package idempotency). A relay that is stopped (its context ends) during or
// after a publish is not a crash: it still deletes the rows the broker took,
// for up to [StopGrace], so a shutdown does not publish them again. Relays running side by side take disjoint batches
// (FOR UPDATE SKIP LOCKED), so they do not publish the same row concurrently.
// The relay's transaction stays open across the publish, which
// [RelayOptions.PublishTimeout] bounds; it raises a shorter server
// idle_in_transaction_session_timeout for itself to match, so that a slow
// broker does not get the session terminated and the batch published again
// on every pass.
//
// Rows fail one by one: a row the broker refuses is retried alone, on its own
// backoff, and parked after [RelayOptions.MaxAttempts] with its last error
// ([Outbox.Parked], [Outbox.Requeue], [Outbox.Discard]); the other rows go on.
// A row that cannot be published as stored — written into the table directly
// or changed there, not through Add, with headers that are not a JSON object
// of strings or that [sdk.Prepare] refuses (a reserved or empty name, invalid
// UTF-8), a delay beyond [sdk.MaxDelay] or an invalid queue name — is set
// aside at once: parked with the reason as its last error (starting "outbox:
// set aside"), logged once at ERROR, and the rows behind it go on (but the
// later rows of its ordering key, which wait behind it). An
// operator sees parked rows with `berth outbox list` (or [Outbox.Parked]),
// repairs such a row in SQL (e.g. UPDATE ... SET headers = '{}' WHERE id =
// N) and puts it back with `berth outbox requeue -db URL N` ([Outbox.Requeue]), or
// drops it with `berth outbox discard -db URL N` ([Outbox.Discard]); a row requeued
// unrepaired is set aside again. A row written without a message ID is not
// set aside: the relay gives it one, stored in the row with the pass's
// record, so that its retries carry the same ID.
//
// A message's Delay counts from the write (Add), not from the relay: the
// relay publishes it with what is left of the Delay, none once it has
// passed (a relay that was down, or rows that waited for a retry).
//
// While PostgreSQL is down the relay polls with a capped, jittered backoff
// ([RelayOptions.OutageBackoff]) and logs the outage when it starts, at most
// every [OutageLogInterval] while it lasts, and when it ends. It does the
// same while the broker is down: after a pass that published nothing
// because every publish failed as unavailable or closed, the next pass
// waits that backoff, rather than trying the next batch of a backlog after
// PollInterval.
//
// Rows sharing a queue and ordering key are published in the order they were
// added, and a row that waits for its retry or is parked holds back the later
// rows of its key only. To keep that order across concurrent producers, Add
// serialises the transactions that add rows of one queue and key (see
// [Outbox.Add] for the cost and the deadlock to handle); rows without a key
// are not serialised.
//
//	tx, _ := pool.Begin(ctx)
//	_, _ = tx.Exec(ctx, `UPDATE orders SET status='paid' WHERE id=$1`, id)
//	_ = box.Add(ctx, tx, "emails", &sdk.Message{Type: "email.receipt", IdempotencyKey: "receipt:" + id})
//	_ = tx.Commit(ctx)
//	...
//	go box.Relay(ctx, broker, outbox.RelayOptions{}) // publishes after commit
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/internal/pgretry"
	"github.com/berthq/berth/internal/pgschema"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Options configures an Outbox. The zero value uses the table
// public.berth_outbox.
type Options struct {
	Schema string // default "public"
	Table  string // default "berth_outbox"
	// MaxMessageSize is checked at Add, so an oversized message fails the
	// business transaction instead of the relay. Default 256 KiB, the smallest
	// limit of berth's network brokers.
	MaxMessageSize int
	// OnAdd, optional, is called by Add for each message, after its ID is
	// filled and before it is stored, with the business transaction's
	// context. Use it to carry the producer's trace into the row, so the
	// relay's publish continues it:
	//
	//	OnAdd: func(ctx context.Context, m *sdk.Message) { telemetry.Inject(ctx, nil, m) }
	OnAdd func(ctx context.Context, m *sdk.Message)
}

// Outbox writes messages into its table and relays them.
type Outbox struct {
	pool  *pgxpool.Pool
	table string // quoted, schema-qualified
	ident [2]string
	limit int
	onAdd func(ctx context.Context, m *sdk.Message)
}

// ErrInvalidIdentifier reports a schema or table name that is not a plain SQL
// identifier.
var ErrInvalidIdentifier = errors.New("outbox: invalid SQL identifier")

// New returns an Outbox on pool. It validates the identifiers; call Migrate
// (or apply SchemaSQL yourself) before use.
func New(pool *pgxpool.Pool, opts Options) (*Outbox, error) {
	if pool == nil {
		return nil, errors.New("outbox: nil pool")
	}
	if opts.Schema == "" {
		opts.Schema = "public"
	}
	if opts.Table == "" {
		opts.Table = "berth_outbox"
	}
	for _, id := range []string{opts.Schema, opts.Table} {
		if _, err := sqlident.Column(id); err != nil { // one plain identifier each
			return nil, fmt.Errorf("%w: %w", ErrInvalidIdentifier, err)
		}
	}
	if opts.MaxMessageSize <= 0 {
		opts.MaxMessageSize = 256 * 1024
	}
	return &Outbox{
		pool:  pool,
		table: pgx.Identifier{opts.Schema, opts.Table}.Sanitize(),
		ident: [2]string{opts.Schema, opts.Table},
		limit: opts.MaxMessageSize,
		onAdd: opts.OnAdd,
	}, nil
}

// SchemaSQL returns the DDL that Migrate runs, for teams that apply
// migrations themselves. It is idempotent, and upgrades a table made by an
// older version (the parked_at column, the ordering index and the index of
// the rows not parked). On a large busy table, create a missing index
// beforehand with CREATE INDEX CONCURRENTLY, as the statement here blocks
// the table's writes while it builds.
func (o *Outbox) SchemaSQL() string {
	schema := pgx.Identifier{o.ident[0]}.Sanitize()
	idx := pgx.Identifier{o.ident[1] + "_pending_idx"}.Sanitize()
	keyIdx := pgx.Identifier{o.ident[1] + "_key_idx"}.Sanitize()
	unparkedIdx := pgx.Identifier{o.ident[1] + "_unparked_idx"}.Sanitize()
	return fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
CREATE TABLE IF NOT EXISTS %[2]s (
    id             bigserial PRIMARY KEY,
    queue          text        NOT NULL,
    message_id     text        NOT NULL,
    job_type       text        NOT NULL DEFAULT '',
    idempotency_key text       NOT NULL DEFAULT '',
    ordering_key   text        NOT NULL DEFAULT '',
    correlation_id text        NOT NULL DEFAULT '',
    headers        jsonb       NOT NULL DEFAULT '{}',
    body           bytea       NOT NULL DEFAULT '',
    delay_ms       bigint      NOT NULL DEFAULT 0,
    attempts       integer     NOT NULL DEFAULT 0,
    last_error     text        NOT NULL DEFAULT '',
    available_at   timestamptz NOT NULL DEFAULT now(),
    created_at     timestamptz NOT NULL DEFAULT now()
);
-- parked_at: set when the relay gave up on the row (RelayOptions.MaxAttempts).
ALTER TABLE %[2]s ADD COLUMN IF NOT EXISTS parked_at timestamptz;
-- refusals: the failures that count towards parking (attempts also counts
-- those of a broker that was down or closed, which only postpone the row).
ALTER TABLE %[2]s ADD COLUMN IF NOT EXISTS refusals integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS %[3]s ON %[2]s (available_at, id);
-- Rows of one ordering key in order: a failing or parked row holds back the
-- later rows of its key. A lookup must say ordering_key <> '' to use it.
CREATE INDEX IF NOT EXISTS %[4]s ON %[2]s (queue, ordering_key, id) WHERE ordering_key <> '';
-- The relay's read, in id order, of the rows not parked: parked rows stay
-- until an operator requeues or discards them, and a pass must not walk
-- them all (the primary key, or a scan of the table, did on every pass).
CREATE INDEX IF NOT EXISTS %[5]s ON %[2]s (id) WHERE parked_at IS NULL;
`, schema, o.table, idx, keyIdx, unparkedIdx)
}

// Migrate creates the outbox table if it does not exist, or upgrades it. It
// holds a transaction-scoped advisory lock while it runs, so processes that
// start together and all migrate do not race on the catalog (CREATE ... IF
// NOT EXISTS is not safe against a concurrent CREATE of the same name).
// When the table has every column and index of SchemaSQL, it runs no DDL,
// so it takes no lock on the table: a process starting while producers add
// rows (or a relay publishes) does not stall them.
func (o *Outbox) Migrate(ctx context.Context) error {
	tx, err := o.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := pgschema.Lock(ctx, tx, o.ident[0]); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "berth.outbox."+o.ident[0]+"."+o.ident[1]); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	// Done already (every process that starts runs Migrate): the DDL is
	// not run again. ALTER TABLE ... ADD COLUMN IF NOT EXISTS takes its
	// ACCESS EXCLUSIVE lock on the table before it finds the column (and
	// CREATE INDEX IF NOT EXISTS its SHARE lock before it finds the
	// index): it waits for every open transaction that added a row (and
	// for a relay's, held across its publish), and every Add and relay
	// pass queues behind it. A later version that changes the table must
	// check for its change here too, or it would be skipped.
	done, err := o.migrated(ctx, tx)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	if done {
		return nil
	}
	if _, err := tx.Exec(ctx, o.SchemaSQL()); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	return nil
}

// migrated reports whether the outbox table has what SchemaSQL makes: the
// columns added since the first version and every index, by name.
func (o *Outbox) migrated(ctx context.Context, tx pgx.Tx) (bool, error) {
	table := o.ident[1]
	indexes := []string{table + "_pending_idx", table + "_key_idx", table + "_unparked_idx"}
	if ok, err := pgschema.Present(ctx, tx, o.ident[0], indexes...); !ok || err != nil {
		return false, err
	}
	var cols int
	err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_attribute a
		JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')
		AND a.attname IN ('parked_at', 'refusals') AND NOT a.attisdropped`, o.ident[0], table).Scan(&cols)
	return cols == 2, err
}

// Add writes msgs for queue inside tx, the caller's business transaction.
// They are published after tx commits, and never if it rolls back. Add fills
// message IDs and correlation IDs now (see [sdk.Prepare]), so the IDs the
// consumer sees are the ones the producer's transaction recorded.
//
// Ordering keys: rows of one queue and key are published in the order they
// were added, which the relay reads from the rows' ids. Ids are taken at
// insert but become visible at commit, so two transactions adding rows of one
// key could otherwise commit in the opposite order and the relay would
// publish the later row first. Before inserting a row with a key, Add
// therefore takes a transaction-scoped advisory lock on its queue and key
// (pg_advisory_xact_lock, held until tx commits or rolls back). The cost:
// producers of one key wait for each other's commit, so keep transactions
// that add keyed rows short; producers of different keys, and rows without a
// key, do not wait. The locks of one Add call are taken in a fixed order, but
// two transactions that add several keys over several Add calls (or that also
// lock business rows) in opposite orders can deadlock: PostgreSQL detects it
// and aborts one of them with SQLSTATE 40P01 (deadlock_detected), which the
// caller handles by retrying that transaction, as it would a serialization
// failure.
func (o *Outbox) Add(ctx context.Context, tx pgx.Tx, queue string, msgs ...*sdk.Message) error {
	if err := sdk.PrepareAll(ctx, queue, msgs, o.limit); err != nil {
		return err
	}
	if o.onAdd != nil {
		for _, m := range msgs {
			o.onAdd(ctx, m)
		}
		// What OnAdd wrote must pass too: a row the broker would refuse
		// fails the business transaction rather than being parked later.
		if err := sdk.PrepareAll(ctx, queue, msgs, o.limit); err != nil {
			return err
		}
	}
	for _, m := range msgs {
		if err := storable(m); err != nil {
			return err
		}
	}
	batch := &pgx.Batch{}
	for _, k := range o.keyLocks(queue, msgs) {
		batch.Queue(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, k)
	}
	// created_at is the moment of the write (clock_timestamp, not the
	// transaction's start): a message's Delay counts from it.
	q := `INSERT INTO ` + o.table + ` (queue, message_id, job_type, idempotency_key, ordering_key, correlation_id, headers, body, delay_ms, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, clock_timestamp())`
	for _, m := range msgs {
		h, err := json.Marshal(m.Headers)
		if err != nil {
			return fmt.Errorf("outbox: headers of %s: %w", m.ID, err)
		}
		body := m.Body
		if body == nil {
			body = []byte{}
		}
		batch.Queue(q, queue, m.ID, m.Type, m.IdempotencyKey, m.Key, m.CorrelationID, h, body, m.Delay.Milliseconds())
	}
	return tx.SendBatch(ctx, batch).Close()
}

// keyLocks returns the names of the advisory locks Add takes for the ordering
// keys of msgs, distinct and sorted (one Add call always locks in the same
// order). A name holds the outbox table, the queue and the key, each
// prefixed with its length, so no two (table, queue, key) share a name.
func (o *Outbox) keyLocks(queue string, msgs []*sdk.Message) []string {
	var names []string
	seen := map[string]bool{}
	for _, m := range msgs {
		if m.Key == "" || seen[m.Key] {
			continue
		}
		seen[m.Key] = true
		names = append(names, fmt.Sprintf("berth.outbox:%d:%s%d:%s%d:%s%d:%s",
			len(o.ident[0]), o.ident[0], len(o.ident[1]), o.ident[1], len(queue), queue, len(m.Key), m.Key))
	}
	slices.Sort(names)
	return names
}

// PublishTx is [Outbox.Add]: it makes the outbox an
// [sdk.TxPublisher][pgx.Tx], the transactional publish of every broker that
// cannot take part in a PostgreSQL transaction itself (RabbitMQ, SQS, NATS,
// memory). The messages are published by the relay after tx commits.
func (o *Outbox) PublishTx(ctx context.Context, tx pgx.Tx, queue string, msgs ...*sdk.Message) error {
	return o.Add(ctx, tx, queue, msgs...)
}

var _ sdk.TxPublisher[pgx.Tx] = (*Outbox)(nil)

// storable refuses what the outbox table cannot hold: NUL bytes in headers
// (jsonb) and in the text columns. The body is bytea and may hold anything.
func storable(m *sdk.Message) error {
	for k, v := range m.Headers {
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			return &sdk.HeaderError{Name: strings.ReplaceAll(k, "\x00", ""), Reason: "the outbox (PostgreSQL jsonb) cannot store NUL bytes in headers"}
		}
	}
	for _, f := range []string{m.ID, m.Type, m.IdempotencyKey, m.Key, m.CorrelationID} {
		if strings.IndexByte(f, 0) >= 0 {
			return fmt.Errorf("%w: message %q: the outbox (PostgreSQL text) cannot store NUL bytes in ID, Type, IdempotencyKey, Key or CorrelationID",
				sdk.ErrInvalidMessage, m.ID)
		}
	}
	if len(m.Key) > MaxKeyLength {
		return fmt.Errorf("%w: message %.64q: its Key takes %d bytes, over the %d the outbox's key index holds",
			sdk.ErrInvalidMessage, m.ID, len(m.Key), MaxKeyLength)
	}
	return nil
}

// MaxKeyLength bounds, in bytes, a message's Key (its ordering key) in the
// outbox: the table indexes it beside the queue name (80 bytes at most),
// and PostgreSQL refuses a btree index row over 2704 bytes (SQLSTATE
// 54000). Add refuses a longer one with [sdk.ErrInvalidMessage]; before,
// the insert failed the caller's business transaction with that raw
// database error.
const MaxKeyLength = 2048

// RelayOptions configures Relay.
type RelayOptions struct {
	BatchSize    int           // rows per transaction; default 100
	PollInterval time.Duration // wait when the outbox is empty; default 200ms
	// Backoff paces the retries of each row whose publish failed, by that
	// row's own attempt count. Default sdk.DefaultBackoff.
	Backoff sdk.Backoff
	// MaxAttempts is how many failed publishes of a row the relay makes
	// before it parks the row: a parked row is kept with its last error and
	// no longer published until [Outbox.Requeue] (list them with
	// [Outbox.Parked]). Failures that wrap [sdk.ErrUnavailable] (the broker
	// is down, not refusing the row) or [sdk.ErrClosed] (the publisher was
	// closed, e.g. at shutdown, with the row's publish outstanding) never
	// park a row, they only postpone it, and do not count towards
	// MaxAttempts (they do lengthen the row's backoff). Default 20 (about
	// an hour with the default backoff).
	MaxAttempts int
	// PublishTimeout bounds the publishing of one batch (every Publish call
	// of a RelayOnce pass, together), during which the relay's transaction
	// holds the batch's rows and sits idle on the server. Rows whose publish
	// it cuts short are postponed like those of a broker that is down
	// (never parked); the broker may have taken them, so they may be
	// published twice, with the same IDs. For this bounded time the relay
	// raises, in its own transaction only (SET LOCAL), a server
	// idle_in_transaction_session_timeout that is set and shorter, to
	// PublishTimeout + [IdleMargin]: otherwise a publish slower than that
	// setting gets the session terminated, the rows are not deleted and
	// every pass publishes them again. Default [DefaultPublishTimeout]
	// (30s); negative means no bound (as in [sdk.WorkerOptions.Timeout]): the
	// publish runs until the publisher returns or the relay's ctx ends, and
	// the relay turns idle_in_transaction_session_timeout off (0) in its
	// transaction, as long as the batch's rows stay locked. A server
	// transaction_timeout still ends the transaction: set it above the
	// slowest publish for the relay's role.
	PublishTimeout time.Duration
	// OutageBackoff paces the polls while the outbox table cannot be read
	// (the database is down or unreachable), by the number of polls that
	// failed in a row. Each field not set takes its default: Base
	// PollInterval, Max [DefaultOutageMax] (or Base when longer), Jitter
	// 0.2 (negative: none). The first poll that succeeds returns to
	// PollInterval. It also paces the passes that follow passes whose
	// record the database lost ([ErrPublishNotRecorded]), by how many
	// were lost in a row: their rows are published again at each; and
	// those that follow passes that published nothing because the broker
	// was down (every row tried failed with [sdk.ErrUnavailable] or
	// [sdk.ErrClosed], or was cut short by PublishTimeout), by how many in
	// a row, until a pass publishes again: otherwise, with a backlog, each
	// pass would try the next batch after PollInterval for the whole outage.
	OutageBackoff sdk.Backoff
	Logger        *slog.Logger // default slog.Default()
}

// DefaultMaxAttempts is RelayOptions.MaxAttempts when it is not set.
const DefaultMaxAttempts = 20

// DefaultPublishTimeout is RelayOptions.PublishTimeout when it is not set.
const DefaultPublishTimeout = 30 * time.Second

// IdleMargin is what the relay adds to RelayOptions.PublishTimeout when it
// raises idle_in_transaction_session_timeout for its transaction: the time a
// publisher may take to return after its context ends, and the relay to send
// its next statement.
const IdleMargin = 5 * time.Second

// ErrPublishNotRecorded reports that the relay published rows but the
// transaction that deletes them (and records the failed ones) did not
// commit: the database ended it, typically by terminating the session
// (idle_in_transaction_session_timeout or transaction_timeout shorter than
// the publish, pg_terminate_backend, a restart, a broken connection). The
// rows stay in the outbox and are published again, with the same IDs and
// idempotency keys (unless a COMMIT whose answer was lost went through).
var ErrPublishNotRecorded = errors.New("outbox: rows published but not recorded; they will be published again")

func (opts RelayOptions) withDefaults() RelayOptions {
	if opts.PollInterval <= 0 {
		opts.PollInterval = 200 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 100
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = DefaultMaxAttempts
	}
	if opts.PublishTimeout == 0 {
		opts.PublishTimeout = DefaultPublishTimeout
	}
	// Field by field, as the doc says: a Backoff with only some fields set
	// took sdk's defaults for the others (Base 1s, Max 5m), so a relay
	// could wait up to 6 minutes after the database came back.
	if opts.OutageBackoff.Base <= 0 {
		opts.OutageBackoff.Base = opts.PollInterval
	}
	if opts.OutageBackoff.Max <= 0 {
		opts.OutageBackoff.Max = max(DefaultOutageMax, opts.OutageBackoff.Base)
	}
	if opts.OutageBackoff.Jitter == 0 {
		opts.OutageBackoff.Jitter = 0.2
	}
	return opts
}

// Relay publishes committed outbox rows to pub until ctx is done, then
// returns nil. Failed publishes are retried with backoff, row by row; the
// rows stay in the table until the broker accepts them or they are parked.
// Rows that cannot be published as stored are parked at once (see
// [Outbox.RelayOnce]).
//
// While the outbox table cannot be read (PostgreSQL is down or
// unreachable), Relay polls with [RelayOptions.OutageBackoff] instead of
// every PollInterval, and logs the outage once when it starts (WARN), then
// at most every [OutageLogInterval] while it lasts, and once when it ends
// (INFO).
//
// Likewise while the broker is down: after a pass that published nothing
// because every row it tried failed with [sdk.ErrUnavailable] or
// [sdk.ErrClosed] (or was cut short by RelayOptions.PublishTimeout), Relay
// waits OutageBackoff, growing with each such pass in a row, and logs the
// outage once when it starts (WARN), at most every [OutageLogInterval]
// while it lasts, and once when a pass publishes again (INFO). The rows
// tried are postponed on their own backoff as always.
//
// If the application closes the pool the Outbox was given while Relay runs
// (before ending ctx), Relay logs that once (WARN) and returns an error
// wrapping [sdk.ErrClosed]: nothing comes from a closed pool again, so it
// does not poll it for ever. A database that is down or unreachable is not
// a closed pool: Relay polls until it is back.
func (o *Outbox) Relay(ctx context.Context, pub sdk.Publisher, opts RelayOptions) error {
	opts = opts.withDefaults()
	return o.relayLoop(ctx, opts, func(ctx context.Context) (int, error) { return o.RelayOnce(ctx, pub, opts) }, realClock{})
}

// poolClosed reports whether err, a failure to begin the relay's
// transaction while the relay's context is live, says the application
// closed the pool (see pgretry.ClosedBy). Any other failure (the database
// down, a connect refused or timed out) is not a closed pool.
func (o *Outbox) poolClosed(err error) bool { return pgretry.ClosedBy(o.pool, err) }

// OutageLogInterval is how often, at most, Relay logs that the outbox table
// is still unreachable, after the warning that the outage started.
const OutageLogInterval = time.Minute

// DefaultOutageMax is RelayOptions.OutageBackoff.Max when OutageBackoff is
// not set.
const DefaultOutageMax = 30 * time.Second

// relayClock is what the relay loop takes time from: the real clock, or a
// fake in tests.
type relayClock interface {
	Now() time.Time
	// Wait waits d or until ctx ends, and reports whether d passed.
	Wait(ctx context.Context, d time.Duration) bool
	Float64() float64 // the backoff's jitter, in [0, 1)
}

type realClock struct{}

func (realClock) Now() time.Time   { return time.Now() }
func (realClock) Float64() float64 { return rand.Float64() }
func (realClock) Wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// outage is a run of failed passes of the relay (the table unreadable, the
// broker down): how many in a row, since when, and when it was last logged.
type outage struct {
	failures      int
	since, logged time.Time
}

// fail counts one more failed pass at now and returns how many in a row;
// it calls log with start true for the first, and false (with the count and
// the outage's length as attributes) at most every [OutageLogInterval]
// after.
func (u *outage) fail(now time.Time, log func(start bool, attrs ...any)) int {
	u.failures++
	switch {
	case u.failures == 1:
		u.since, u.logged = now, now
		log(true)
	case now.Sub(u.logged) >= OutageLogInterval:
		u.logged = now
		log(false, u.failures, "for", now.Sub(u.since).Round(time.Second))
	}
	return u.failures
}

// end ends the outage at now and returns how many passes failed in it (0:
// none was under way) and how long it lasted.
func (u *outage) end(now time.Time) (int, time.Duration) {
	n := u.failures
	u.failures = 0
	return n, now.Sub(u.since).Round(time.Millisecond)
}

// relayLoop runs pass until ctx ends, pacing and logging as Relay says. It
// returns nil when ctx ends, and the pass's error when it says the pool is
// closed (a dbError wrapping sdk.ErrClosed).
func (o *Outbox) relayLoop(ctx context.Context, opts RelayOptions, pass func(context.Context) (int, error), clock relayClock) error {
	var (
		db   outage // passes that could not read the table
		lost int    // consecutive passes whose record the database lost
		// passes the broker failed as a whole (brokerDownError)
		broker outage
	)
	for ctx.Err() == nil {
		n, err := pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		wait := opts.PollInterval
		var de *dbError
		dbFailed := errors.As(err, &de)
		if dbFailed && errors.Is(de, sdk.ErrClosed) {
			opts.Logger.Warn("outbox: relay stopped: the pool is closed (close it after the relay's context ends)",
				"table", o.table, "err", err)
			return err
		}
		if dbFailed {
			k := db.fail(clock.Now(), func(start bool, attrs ...any) {
				if start {
					opts.Logger.Warn("outbox: relay: cannot read the outbox table (database down or unreachable?); polling with backoff until it can",
						append([]any{"table", o.table, "err", err}, attrs...)...)
				} else {
					opts.Logger.Warn("outbox: relay: still cannot read the outbox table",
						append([]any{"table", o.table, "failed_polls"}, append(attrs, "err", err)...)...)
				}
			})
			wait = opts.OutageBackoff.Delay(k, clock.Float64())
			if !clock.Wait(ctx, wait) {
				return nil
			}
			continue
		}
		if failures, took := db.end(clock.Now()); failures > 0 {
			opts.Logger.Info("outbox: relay: the outbox table can be read again",
				"table", o.table, "failed_polls", failures, "outage", took)
		}
		if !errors.Is(err, ErrPublishNotRecorded) {
			lost = 0
		}
		var bd *brokerDownError
		if errors.As(err, &bd) {
			// The rows it tried are postponed on their own backoff, but
			// the next batch would be tried after PollInterval: with a
			// backlog, a failed publish, an UPDATE of a batch and a
			// warning every PollInterval for the whole outage.
			k := broker.fail(clock.Now(), func(start bool, attrs ...any) {
				if start {
					opts.Logger.Warn("outbox: relay: the broker is unavailable (every publish of a pass failed); the rows tried are postponed, and passes are paced with backoff until it takes messages again",
						append([]any{"table", o.table, "err", err}, attrs...)...)
				} else {
					opts.Logger.Warn("outbox: relay: the broker is still unavailable",
						append([]any{"table", o.table, "failed_passes"}, append(attrs, "err", err)...)...)
				}
			})
			if !clock.Wait(ctx, opts.OutageBackoff.Delay(k, clock.Float64())) {
				return nil
			}
			continue
		}
		if n > 0 || err == nil {
			// A pass that published ends the outage; so does one with
			// nothing to try (the rows parked, discarded, or waiting on
			// their own backoff): it is not known to go on, and the next
			// one must start its backoff and its warning afresh.
			if failed, took := broker.end(clock.Now()); failed > 0 && n > 0 {
				opts.Logger.Info("outbox: relay: the broker takes messages again",
					"table", o.table, "failed_passes", failed, "outage", took)
			}
		}
		switch {
		case errors.Is(err, ErrPublishNotRecorded):
			// Its rows were not marked failed, so no row backoff holds
			// them: without this one, a cause that lasts (a
			// transaction_timeout shorter than the publish) published
			// the same batch again every PollInterval.
			lost++
			wait = opts.OutageBackoff.Delay(lost, clock.Float64())
			opts.Logger.Error("outbox: relay: the database ended the relay's transaction after the publish; the rows it published were not deleted and are published again (same IDs, consumers dedupe)",
				"table", o.table, "err", err, "in_a_row", lost, "next_pass_in", wait)
		case err != nil:
			opts.Logger.Warn("outbox: relay: some rows failed; they are retried with backoff", "table", o.table, "published", n, "err", err)
		case n == opts.BatchSize:
			wait = 0 // a full batch: there is probably more
		}
		if !clock.Wait(ctx, wait) {
			return nil
		}
	}
	return nil
}

type row struct {
	id    int64
	queue string
	msg   *sdk.Message
	// filled by RelayOnce
	attempts int
	refusals int
	err      error
	// bad, when set, says why the row cannot be published as stored
	// (headers that do not decode, a message sdk.Prepare refuses): the
	// relay sets it aside (parks it) at once instead of retrying it.
	bad error
}

const rowColumns = `id, queue, message_id, job_type, idempotency_key, ordering_key, correlation_id, headers, body, delay_ms, attempts`

// scanRow reads rowColumns, then the extra columns into extra. Headers that
// do not decode (a row written by hand or by another tool: a number or null for a
// value, an array) do not fail the scan: the row comes back with no headers
// and bad set, so that one such row cannot stall every read of the table.
func scanRow(rows pgx.Rows, extra ...any) (row, error) {
	var r row
	var headers []byte
	var delayMS int64
	m := &sdk.Message{}
	dest := append([]any{&r.id, &r.queue, &m.ID, &m.Type, &m.IdempotencyKey, &m.Key, &m.CorrelationID, &headers, &m.Body, &delayMS, &r.attempts}, extra...)
	if err := rows.Scan(dest...); err != nil {
		return r, err
	}
	if err := decodeHeaders(headers, m); err != nil {
		r.bad = fmt.Errorf("headers are not a JSON object of strings: %w", err)
	}
	m.Delay = msDuration(delayMS)
	r.msg = m
	return r, nil
}

// decodeHeaders sets m.Headers from the headers column, nil when it holds
// none. A value that is not a string is an error, null included (decoding
// into a map of strings would make it ""), and leaves m.Headers nil.
func decodeHeaders(col []byte, m *sdk.Message) error {
	var h map[string]*string
	if err := json.Unmarshal(col, &h); err != nil {
		return err
	}
	if len(h) == 0 {
		return nil
	}
	m.Headers = make(map[string]string, len(h))
	for k, v := range h {
		if v == nil {
			m.Headers = nil
			return fmt.Errorf("header %q is null", k)
		}
		m.Headers[k] = *v
	}
	return nil
}

// msDuration is ms milliseconds as a Duration, saturated at the Duration's
// range: a delay_ms written into the table directly may be any bigint, and
// multiplying wraps past some 292 years (a delay of centuries would become
// one of a second, and pass the check against sdk.MaxDelay).
func msDuration(ms int64) time.Duration {
	const per = int64(time.Millisecond)
	switch {
	case ms > math.MaxInt64/per:
		return math.MaxInt64
	case ms < math.MinInt64/per:
		return math.MinInt64
	}
	return time.Duration(ms * per)
}

// RelayOnce publishes one batch of due rows and deletes them, in one
// transaction, and returns how many it published. Rows locked by another
// relay are skipped.
//
// Each row succeeds or fails on its own: a row the broker refuses (too
// large, a header it cannot carry) does not hold back the others. It is
// retried alone after its own backoff, its attempts counted, and parked
// after RelayOptions.MaxAttempts. The error, when some rows failed, joins
// their causes; the rows published are deleted all the same.
//
// Rows with the same queue and ordering key (sdk.Message.Key) are published
// in the order they were added, one per Publish call, so that a refused row
// is never overtaken by a later row of its key: while a row waits for its
// retry, or is parked, the later rows of its key wait too (the rows of other
// keys, and rows without a key, go on). Rows without a key are published in
// one call per queue; through an [sdk.AsyncPublisher], each row is its own
// PublishAsync, all of a round in flight at once.
//
// The transaction holds the batch's rows while the broker publishes them,
// for at most RelayOptions.PublishTimeout (without bound when it is
// negative), and raises a shorter server idle_in_transaction_session_timeout
// to cover that, or turns it off for an unbounded publish (SET LOCAL). If the
// transaction is lost all the same after the publish (the session was
// terminated, the connection broke) and rows were published, the error wraps
// [ErrPublishNotRecorded] and says why: the rows stay, and are published
// again with the same IDs.
//
// Rows that cannot be published as stored (see the package doc) are parked
// at once with the reason, and logged at ERROR once; the later rows of their
// ordering key wait behind them as behind any parked row. Each message is
// published with what is left of its Delay, counted from the write.
//
// When ctx ends during the publish or after it, the pass still records what
// the broker took (deletes those rows), for up to [StopGrace] after ctx
// ends; the rows whose publish the end cut short are left untouched (no
// attempt counted). Through an [sdk.AsyncPublisher], a message sent before
// ctx ended is not cut short by it: its result is awaited for up to half of
// StopGrace. It then returns how many it deleted and ctx's error.
//
// If the application has closed the pool, RelayOnce publishes nothing and
// its error wraps [sdk.ErrClosed].
func (o *Outbox) RelayOnce(ctx context.Context, pub sdk.Publisher, opts RelayOptions) (int, error) {
	opts = opts.withDefaults()
	tx, err := o.pool.Begin(ctx)
	if err != nil {
		if ctx.Err() == nil && o.poolClosed(err) {
			return 0, &dbError{fmt.Errorf("outbox: the pool is closed: %w: %w", sdk.ErrClosed, err)}
		}
		return 0, &dbError{err}
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	// Due rows, except those behind an earlier row of their key that waits
	// for a retry or is parked. remaining_ms is what is left of the
	// message's Delay, which counts from the write (created_at), not from
	// this pass: zero once it has passed.
	// A created_at of ±infinity (a row written or changed by hand) cannot
	// be subtracted from (PostgreSQL before 17): it counts as written in
	// the infinite past (nothing left) or future (the whole Delay), rather
	// than failing every pass's read of the table.
	//
	// The lookup of an earlier row of the key says e.ordering_key <> '':
	// the ordering index is partial (WHERE ordering_key <> ''), and
	// PostgreSQL uses it only when the query implies its predicate, which
	// e.ordering_key = o.ordering_key does not. Without it each keyed row
	// was checked by walking every row with a lower id (parked rows
	// included): a pass over 100 keyed rows behind 20,000 parked ones read
	// the table 100 times.
	rows, err := tx.Query(ctx, `SELECT `+rowColumns+`, refusals,
  CASE WHEN isfinite(created_at)
    THEN GREATEST(0, LEAST(delay_ms, delay_ms - floor(EXTRACT(EPOCH FROM clock_timestamp() - created_at) * 1000)))::bigint
    WHEN created_at > clock_timestamp() THEN GREATEST(0, delay_ms)
    ELSE 0 END
FROM `+o.table+` AS o
WHERE parked_at IS NULL AND available_at <= now()
  AND NOT (ordering_key <> '' AND EXISTS (SELECT 1 FROM `+o.table+` AS e
      WHERE e.ordering_key <> '' AND e.queue = o.queue AND e.ordering_key = o.ordering_key AND e.id < o.id
        AND (e.parked_at IS NOT NULL OR e.available_at > now())))
ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, opts.BatchSize)
	if err != nil {
		return 0, &dbError{err}
	}
	var batch []*row
	for rows.Next() {
		var refusals int
		var remainingMS int64
		r, err := scanRow(rows, &refusals, &remainingMS)
		if err != nil {
			rows.Close()
			return 0, &dbError{err}
		}
		r.refusals = refusals
		r.msg.Delay = msDuration(remainingMS)
		batch = append(batch, &r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, &dbError{err}
	}
	if len(batch) == 0 {
		return 0, nil
	}
	filled, err := o.fillIDs(ctx, tx, batch)
	if err != nil {
		return 0, &dbError{err}
	}
	// Rows that cannot be published as stored are set aside (parked) now,
	// with the reason: retrying them cannot help, and a row that fails every
	// pass must not hold back the rows behind it.
	batch, aside := setAside(ctx, batch)
	if len(aside) > 0 {
		if err := o.park(ctx, tx, aside); err != nil {
			return 0, &dbError{err}
		}
	}
	if len(batch) == 0 {
		if err := tx.Commit(ctx); err != nil {
			return 0, &dbError{err}
		}
		o.logSetAside(ctx, opts.Logger, aside)
		return 0, nil
	}
	batch, err = o.dropOvertaking(ctx, tx, batch)
	if err != nil {
		return 0, &dbError{err}
	}

	// The transaction sits idle on the server while the broker works: keep
	// a short server idle_in_transaction_session_timeout from ending it
	// (turn it off when the publish has no bound).
	idle := time.Duration(-1)
	if opts.PublishTimeout > 0 {
		idle = opts.PublishTimeout + IdleMargin
	}
	if err := raiseIdleTimeout(ctx, tx, idle); err != nil {
		return 0, &dbError{err}
	}
	start := time.Now()
	var (
		pctx   context.Context
		cancel context.CancelFunc
	)
	// The broker's answers to what was already sent (an AsyncPublisher's
	// results: RabbitMQ's confirms, JetStream's acks) are awaited on wctx:
	// within PublishTimeout and, when ctx ends (the relay is stopping), for
	// up to half of StopGrace after it, the rest of which is the record's.
	// A row the broker took whose answer came just after the stop was left
	// untouched, and published again at the next start.
	wctx, wcancel := afterGrace(ctx, StopGrace/2)
	if opts.PublishTimeout > 0 {
		deadline := start.Add(opts.PublishTimeout)
		pctx, cancel = context.WithDeadline(ctx, deadline)
		var dcancel context.CancelFunc
		wctx, dcancel = context.WithDeadline(wctx, deadline)
		defer dcancel()
	} else {
		pctx, cancel = context.WithCancel(ctx) // no bound
	}
	publishInOrder(pctx, wctx, pub, batch)
	// wctx's deadline is PublishTimeout's (its grace ends it Canceled).
	timedOut := errors.Is(pctx.Err(), context.DeadlineExceeded) || errors.Is(wctx.Err(), context.DeadlineExceeded)
	wcancel()
	cancel()
	// Record the outcome even when ctx ends now or during the recording
	// (the relay is stopping): rolling back would publish again, at the
	// next start, every row the broker took — on every shutdown. The
	// recording gets StopGrace after ctx ends.
	rctx, rcancel := afterGrace(ctx, StopGrace)
	defer rcancel()
	stopped := ctx.Err()
	if stopped != nil {
		// The failures of this pass came from the stop, and say nothing of
		// their rows: leave those rows as they are (the broker may have
		// taken some of them; they are published again, same IDs).
		timedOut = false
		for _, r := range batch {
			if r.err != nil {
				r.err = errNotTried
			}
		}
	}
	if timedOut {
		for _, r := range batch {
			if r.err != nil && r.err != errNotTried && errors.Is(r.err, context.DeadlineExceeded) {
				r.err = &publishTimeoutError{limit: opts.PublishTimeout, err: r.err}
			}
		}
	}
	var (
		done                []int64
		failedIDs           []int64
		failedErrs          []string
		failedDelays        []float64
		failedPark          []bool
		failedRefusal       []bool
		pubErr              error
		reported            = map[string]bool{}
		maxAttempts, parked = opts.MaxAttempts, 0
		failures            int
		refused             int
	)
	for _, r := range batch {
		switch {
		case r.err == nil:
			done = append(done, r.id)
		case r.err == errNotTried:
		default:
			// Saturated like the columns (see the UPDATE below).
			attempts := min(r.attempts+1, math.MaxInt32)
			// Only refusals count towards parking: an outage postpones
			// the row (its backoff grows with attempts) but must not use
			// up its MaxAttempts.
			refusal := !brokerGone(r.err)
			if refusal {
				refused++
			}
			park := refusal && r.refusals+1 >= maxAttempts
			if park {
				parked++
			}
			failedIDs = append(failedIDs, r.id)
			failedErrs = append(failedErrs, strings.ReplaceAll(sdk.SanitizeReason(r.err.Error()), "\x00", ""))
			failedDelays = append(failedDelays, opts.Backoff.Delay(attempts, rand.Float64()).Seconds())
			failedPark = append(failedPark, park)
			failedRefusal = append(failedRefusal, refusal)
			failures++
			if text := r.err.Error(); !reported[text] && len(reported) < 5 {
				reported[text] = true
				pubErr = errors.Join(pubErr, fmt.Errorf("outbox: row %d (message %s, attempt %d): %w", r.id, dlq.EscapeText(r.msg.ID, false), attempts, escapedError{r.err}))
			}
		}
	}
	if failures > len(reported) {
		pubErr = errors.Join(pubErr, fmt.Errorf("outbox: %d rows failed in all", failures))
	}
	if failures > 0 && refused == 0 && len(done) == 0 {
		pubErr = &brokerDownError{pubErr} // Relay paces its passes
	}
	// From here on, a failure leaves the rows published in this pass in
	// the table, to be published again: say so, and why. A pass that
	// published nothing lost only the record of its failures (the rows are
	// tried again sooner): not ErrPublishNotRecorded.
	notRecorded := func(err error) error {
		if len(done) == 0 {
			return errors.Join(pubErr, fmt.Errorf("outbox: recording the failed rows: %s%w", sessionEndCause(err), err))
		}
		return errors.Join(pubErr, fmt.Errorf("%w (%d published; publish took %s): %s%w",
			ErrPublishNotRecorded, len(done), time.Since(start).Round(time.Millisecond), sessionEndCause(err), err))
	}
	if stopped != nil && len(done) == 0 && len(aside) == 0 && filled == 0 {
		return 0, stopped // nothing to record: roll back
	}
	if len(done) > 0 {
		if _, err := tx.Exec(rctx, `DELETE FROM `+o.table+` WHERE id = ANY($1)`, done); err != nil {
			return 0, notRecorded(err)
		}
	}
	if len(failedIDs) > 0 {
		// clock_timestamp, not now(): now() is the start of this
		// transaction, before the publish, which may have taken longer
		// than the backoff itself.
		//
		// The counts saturate at the integer maximum rather than overflow:
		// a row whose count was written by hand at the maximum would
		// otherwise fail this UPDATE, roll the pass back, and have the rows
		// published with it published again on every pass.
		if _, err := tx.Exec(rctx, `UPDATE `+o.table+` AS o SET attempts = LEAST(o.attempts::bigint + 1, 2147483647), last_error = f.err,
refusals = LEAST(o.refusals::bigint + CASE WHEN f.refusal THEN 1 ELSE 0 END, 2147483647),
available_at = clock_timestamp() + f.delay * interval '1 second',
parked_at = CASE WHEN f.park THEN clock_timestamp() END
FROM unnest($1::bigint[], $2::text[], $3::float8[], $4::bool[], $5::bool[]) AS f(id, err, delay, park, refusal)
WHERE o.id = f.id`, failedIDs, failedErrs, failedDelays, failedPark, failedRefusal); err != nil {
			return 0, notRecorded(err)
		}
	}
	if err := tx.Commit(rctx); err != nil {
		return 0, notRecorded(err)
	}
	o.logSetAside(ctx, opts.Logger, aside)
	if parked > 0 {
		opts.Logger.Error("outbox: rows parked after failing every attempt; see Outbox.Parked", "table", o.table, "parked", parked, "max_attempts", maxAttempts)
	}
	if stopped != nil {
		return len(done), stopped
	}
	return len(done), pubErr
}

// fillIDs gives the rows without a message ID (written into the table
// directly, not through Add, which fills them) an ID of their own, in the
// row too, within tx. The relay matches a broker's per-message outcome
// ([sdk.PublishError]) by ID: without one, the broker filled a fresh ID in
// its copy, the row's outcome was not found, and a refused row was taken
// as published and deleted (lost). Once the pass commits, the row keeps
// its ID, so its retries carry the same one, which consumers dedupe on (a
// pass whose record the database loses loses the ID too: the next pass
// gives another).
func (o *Outbox) fillIDs(ctx context.Context, tx pgx.Tx, batch []*row) (int, error) {
	var ids []int64
	var mids []string
	for _, r := range batch {
		if r.msg.ID == "" {
			r.msg.ID = sdk.NewID()
			ids, mids = append(ids, r.id), append(mids, r.msg.ID)
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	_, err := tx.Exec(ctx, `UPDATE `+o.table+` AS o SET message_id = f.mid
FROM unnest($1::bigint[], $2::text[]) AS f(id, mid) WHERE o.id = f.id`, ids, mids)
	return len(ids), err
}

// escapedError is a row's failure in the error of a pass: its text (a
// broker's, which may quote the message ID or other untrusted text) is
// escaped; errors.Is and errors.As still see the cause.
type escapedError struct{ err error }

func (e escapedError) Error() string { return dlq.EscapeText(e.err.Error(), false) }
func (e escapedError) Unwrap() error { return e.err }

// setAside splits batch into the rows to publish and those that cannot be
// published as stored: headers that do not decode, or a message that
// [sdk.Prepare] refuses (a reserved or empty header name, invalid UTF-8, a
// delay beyond sdk.MaxDelay, an invalid queue name) — rows written into the
// table directly, not through Add, or changed there. Each such row gets its
// reason in bad. The rows of the batch behind a set-aside row of their queue
// and ordering key are left out of both (untouched, for a later pass, which
// holds them back behind the parked row).
func setAside(ctx context.Context, batch []*row) (publish, aside []*row) {
	type qk struct{ queue, key string }
	first := map[qk]int64{}
	for _, r := range batch {
		if r.bad == nil {
			if err := sdk.Prepare(ctx, r.queue, r.msg.Clone(), 0); err != nil {
				r.bad = err
			}
		}
		if r.bad == nil {
			continue
		}
		aside = append(aside, r)
		if k := (qk{r.queue, r.msg.Key}); r.msg.Key != "" {
			if id, ok := first[k]; !ok || r.id < id {
				first[k] = r.id
			}
		}
	}
	if len(aside) == 0 {
		return batch, nil
	}
	for _, r := range batch {
		if r.bad != nil {
			continue
		}
		if id, ok := first[qk{r.queue, r.msg.Key}]; ok && r.msg.Key != "" && r.id > id {
			continue
		}
		publish = append(publish, r)
	}
	return publish, aside
}

// setAsideReason is the last_error of a row set aside: why it cannot be
// published, valid UTF-8, without NUL, at most sdk.MaxReasonLength bytes.
func setAsideReason(r *row) string {
	return strings.ReplaceAll(sdk.SanitizeReason("outbox: set aside, cannot be published as stored (repair the row, then Requeue it, or Discard it): "+r.bad.Error()), "\x00", "")
}

// park parks the rows set aside, in tx, with their reason as last_error.
// Their attempts are left as they are: they were never published.
func (o *Outbox) park(ctx context.Context, tx pgx.Tx, aside []*row) error {
	ids := make([]int64, len(aside))
	reasons := make([]string, len(aside))
	for i, r := range aside {
		ids[i], reasons[i] = r.id, setAsideReason(r)
	}
	_, err := tx.Exec(ctx, `UPDATE `+o.table+` AS o SET parked_at = clock_timestamp(), last_error = f.err
FROM unnest($1::bigint[], $2::text[]) AS f(id, err) WHERE o.id = f.id`, ids, reasons)
	return err
}

// maxSetAsideLogs bounds the rows a pass logs one by one when it sets them
// aside; the rest are counted in one more line.
const maxSetAsideLogs = 10

// logSetAside logs, once each (after the commit that parked them), the rows
// set aside, at ERROR: an operator must repair or discard them. Their text
// is untrusted and escaped.
func (o *Outbox) logSetAside(ctx context.Context, log *slog.Logger, aside []*row) {
	for i, r := range aside {
		if i == maxSetAsideLogs {
			log.ErrorContext(ctx, "outbox: relay: more rows set aside (parked) in this pass; see Outbox.Parked or berth outbox list",
				"table", o.table, "more", len(aside)-maxSetAsideLogs)
			return
		}
		log.ErrorContext(ctx, "outbox: relay: row set aside (parked): it cannot be published as stored; repair it and Requeue it, or Discard it (berth outbox list|requeue|discard)",
			"table", o.table, "row", r.id, "queue", dlq.EscapeText(r.queue, false), "message_id", dlq.EscapeText(r.msg.ID, false),
			"reason", dlq.EscapeText(setAsideReason(r), false))
	}
}

// brokerDownError is the error of a pass that published nothing, every
// row it tried having failed as [brokerGone] says (the broker down or
// closed, or the publish cut short by RelayOptions.PublishTimeout): [Outbox.Relay]
// paces the passes that follow with RelayOptions.OutageBackoff.
type brokerDownError struct{ err error }

func (e *brokerDownError) Error() string { return e.err.Error() }
func (e *brokerDownError) Unwrap() error { return e.err }

// dbError is a failure of the outbox table's database before any publish
// of the pass (the database is down, the table missing): nothing was
// published, and [Outbox.Relay] backs off.
type dbError struct{ err error }

func (e *dbError) Error() string { return e.err.Error() }
func (e *dbError) Unwrap() error { return e.err }

// StopGrace is how long a relay pass whose context ends after its publish
// (the relay is stopping) goes on recording what the broker took, so that
// those rows are not published again at the next start. Through an
// [sdk.AsyncPublisher], the first half of it also waits for the broker's
// answers (confirms, acks) to the messages sent before the context ended.
const StopGrace = 5 * time.Second

// afterGrace returns a context with ctx's values that ends grace after ctx
// ends (or when cancel is called), not with it.
func afterGrace(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-gctx.Done():
		}
	})
	return gctx, func() {
		stop()
		cancel()
	}
}

// brokerGone reports a failure that says nothing about the row: the broker
// is down, the publisher was closed, or the publish outlasted
// RelayOptions.PublishTimeout. Such a failure never parks a row.
func brokerGone(err error) bool {
	var te *publishTimeoutError
	return errors.Is(err, sdk.ErrUnavailable) || errors.Is(err, sdk.ErrClosed) || errors.As(err, &te)
}

// publishTimeoutError is the failure of a row whose publish
// RelayOptions.PublishTimeout cut short.
type publishTimeoutError struct {
	limit time.Duration
	err   error
}

func (e *publishTimeoutError) Error() string {
	return fmt.Sprintf("outbox: publish not done within RelayOptions.PublishTimeout (%s): %v", e.limit, e.err)
}

func (e *publishTimeoutError) Unwrap() error { return e.err }

// raiseIdleTimeout raises the session's idle_in_transaction_session_timeout
// to d for the rest of tx (SET LOCAL) when it is set and shorter: the relay
// is idle in tx while it publishes, for at most d. A negative d (a publish
// without bound) turns a set timeout off (0) for the rest of tx. A setting
// of 0 (no limit) or a longer one is left alone.
func raiseIdleTimeout(ctx context.Context, tx pgx.Tx, d time.Duration) error {
	var ms int64 // 0: off
	if d >= 0 {
		ms = max(1, min(d.Milliseconds(), math.MaxInt32)) // the setting's unit and range
	}
	// The CASE keeps the cast to the setting's own row whatever order the
	// planner tests the conditions in (pg_settings holds text of every kind).
	if _, err := tx.Exec(ctx, `SELECT set_config(name, $1, true) FROM pg_settings
WHERE name = 'idle_in_transaction_session_timeout'
AND CASE WHEN setting ~ '^[0-9]+$' THEN setting::bigint > 0 AND ($2::bigint = 0 OR setting::bigint < $2::bigint) ELSE false END`,
		strconv.FormatInt(ms, 10), ms); err != nil {
		return fmt.Errorf("outbox: raising idle_in_transaction_session_timeout: %w", err)
	}
	return nil
}

// sessionEndCause explains, for an operator, the server errors that end the
// relay's session or transaction; "" for others.
func sessionEndCause(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return ""
	}
	switch pe.Code {
	case "25P03": // idle_in_transaction_session_timeout
		return "the server's idle_in_transaction_session_timeout ended the session during the publish, " +
			"although the relay raises it to RelayOptions.PublishTimeout + IdleMargin, or turns it off when PublishTimeout is negative (a publisher that ignores its context?): "
	case "25P04": // transaction_timeout (PostgreSQL 17)
		return "the server's transaction_timeout ended the transaction during the publish: " +
			"set it above RelayOptions.PublishTimeout + IdleMargin for the relay's role: "
	case "57P01", "57P02", "57P03": // admin shutdown, crash shutdown, cannot connect now
		return "the session was terminated (pg_terminate_backend or a server shutdown): "
	}
	return ""
}

// errNotTried marks a row left for a later pass: an earlier row of its
// ordering key failed in this one.
var errNotTried = errors.New("outbox: not tried")

// dropOvertaking removes from batch the rows that an earlier row of their
// queue and ordering key, not in batch, would be overtaken by: one that
// another relay holds right now. The rows stay locked until the transaction
// ends and are not touched.
func (o *Outbox) dropOvertaking(ctx context.Context, tx pgx.Tx, batch []*row) ([]*row, error) {
	var queues, keys []string
	var ids, all []int64
	for _, r := range batch {
		all = append(all, r.id)
		if r.msg.Key != "" {
			queues, keys, ids = append(queues, r.queue), append(keys, r.msg.Key), append(ids, r.id)
		}
	}
	if len(ids) == 0 {
		return batch, nil
	}
	// e.ordering_key <> '' (every b.key is a key) lets PostgreSQL use the
	// partial ordering index: without it, this scanned the whole table.
	rows, err := tx.Query(ctx, `SELECT b.queue, b.key, min(b.id) FROM unnest($1::text[], $2::text[], $3::bigint[]) AS b(queue, key, id)
WHERE EXISTS (SELECT 1 FROM `+o.table+` AS e WHERE e.ordering_key <> '' AND e.queue = b.queue AND e.ordering_key = b.key AND e.id < b.id AND e.id <> ALL($4))
GROUP BY b.queue, b.key`, queues, keys, ids, all)
	if err != nil {
		return nil, err
	}
	type qk struct{ queue, key string }
	from := map[qk]int64{}
	for rows.Next() {
		var k qk
		var id int64
		if err := rows.Scan(&k.queue, &k.key, &id); err != nil {
			rows.Close()
			return nil, err
		}
		from[k] = id
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(from) == 0 {
		return batch, nil
	}
	kept := batch[:0]
	for _, r := range batch {
		if id, ok := from[qk{r.queue, r.msg.Key}]; ok && r.id >= id {
			continue
		}
		kept = append(kept, r)
	}
	return kept, nil
}

// publishInOrder publishes batch, setting each row's err: nil when the
// broker accepted it, errNotTried when an earlier row of its ordering key
// failed. In each round, the next row of every ordering key and (in the
// first round) every row without a key are published, one call per queue:
// rows of one key never share a call, so a broker that accepts part of a
// call cannot let a later row of a key overtake a refused one.
//
// wait bounds the wait for the results of an [sdk.AsyncPublisher] (ctx
// bounds the sends): it may outlast ctx, so that what the broker took just
// before ctx ended is known.
func publishInOrder(ctx, wait context.Context, pub sdk.Publisher, batch []*row) {
	type qk struct{ queue, key string }
	var free []*row
	lines := map[qk][]*row{}
	var order []qk
	for _, r := range batch {
		r.err = errNotTried
		if r.msg.Key == "" {
			free = append(free, r)
			continue
		}
		k := qk{r.queue, r.msg.Key}
		if _, ok := lines[k]; !ok {
			order = append(order, k)
		}
		lines[k] = append(lines[k], r)
	}
	round := append([]*row(nil), free...)
	for _, k := range order {
		round = append(round, lines[k][0])
	}
	for len(round) > 0 && ctx.Err() == nil {
		publishRound(ctx, wait, pub, round)
		var next []*row
		for _, k := range order {
			line := lines[k]
			if len(line) == 0 {
				continue
			}
			if line[0].err != nil { // failed: the rest of its key waits
				lines[k] = nil
				continue
			}
			line = line[1:]
			lines[k] = line
			if len(line) > 0 {
				next = append(next, line[0])
			}
		}
		round = next
	}
}

// publishRound publishes rows, one call per queue, and sets each row's err.
// A call refused as a whole (an invalid message fails the batch) is retried
// message by message, so that only the bad row fails; a broker that is down
// fails them all.
func publishRound(ctx, wait context.Context, pub sdk.Publisher, rows []*row) {
	if ap, ok := pub.(sdk.AsyncPublisher); ok {
		publishAsync(ctx, wait, ap, rows)
		return
	}
	byQueue := map[string][]*row{}
	var queues []string
	for _, r := range rows {
		if _, ok := byQueue[r.queue]; !ok {
			queues = append(queues, r.queue)
		}
		byQueue[r.queue] = append(byQueue[r.queue], r)
	}
	for _, q := range queues {
		group := byQueue[q]
		err := publish(ctx, pub, q, group)
		var pe *sdk.PublishError
		switch {
		case err == nil:
			for _, r := range group {
				r.err = nil
			}
		case errors.As(err, &pe):
			for _, r := range group {
				r.err = pe.Failed[r.msg.ID] // nil: accepted
			}
		case len(group) > 1 && ctx.Err() == nil && !errors.Is(err, sdk.ErrUnavailable) && !errors.Is(err, sdk.ErrClosed):
			for _, r := range group {
				r.err = publish(ctx, pub, q, []*row{r})
			}
		default:
			for _, r := range group {
				r.err = err
			}
		}
	}
}

// publishAsync publishes rows through a broker's own asynchronous publish:
// every row is in flight at once (RabbitMQ: a sliding window of confirms
// instead of one batch per queue awaited as a whole) and each gets its own
// outcome, so an invalid row fails alone without a retry round.
//
// The results are awaited on wait, not ctx: a message sent before ctx ended
// may be taken by the broker after, and its row must then be deleted, not
// published again.
func publishAsync(ctx, wait context.Context, ap sdk.AsyncPublisher, rows []*row) {
	results := make([]*sdk.PublishResult, len(rows))
	for i, r := range rows {
		results[i], r.err = ap.PublishAsync(ctx, r.queue, r.msg.Clone())
	}
	for i, r := range rows {
		if results[i] != nil {
			r.err = results[i].Wait(wait)
		}
	}
}

// publish sends copies of the rows' messages (Publish may modify them).
func publish(ctx context.Context, pub sdk.Publisher, queue string, rows []*row) error {
	msgs := make([]*sdk.Message, len(rows))
	for i, r := range rows {
		msgs[i] = r.msg.Clone()
	}
	return pub.Publish(ctx, queue, msgs...)
}

// Pending returns how many messages wait in the outbox to be published,
// parked rows not included.
func (o *Outbox) Pending(ctx context.Context) (int64, error) {
	var n int64
	err := o.pool.QueryRow(ctx, `SELECT count(*) FROM `+o.table+` WHERE parked_at IS NULL`).Scan(&n)
	return n, err
}

// ParkedRow is a row the relay gave up on after RelayOptions.MaxAttempts
// failed publishes.
type ParkedRow struct {
	ID        int64        // the row's id: pass it to Requeue or Discard
	Queue     string       // the queue it was added for
	Message   *sdk.Message // the message as added (no headers when the stored ones do not decode: see LastError)
	Attempts  int          // failed publishes
	LastError string       // the last failure, valid UTF-8, at most sdk.MaxReasonLength bytes; untrusted text
	CreatedAt time.Time    // when it was added (zero when CreatedAtInfinity is not Finite)
	ParkedAt  time.Time    // when the relay parked it (zero when ParkedAtInfinity is not Finite)
	// CreatedAtInfinity and ParkedAtInfinity are pgtype.Infinity or
	// pgtype.NegativeInfinity when the row's created_at or parked_at is
	// 'infinity' or '-infinity' (written or changed in the table by hand:
	// Go's time.Time has no infinity), and pgtype.Finite (zero) otherwise.
	// Their String is "infinity" or "-infinity".
	CreatedAtInfinity pgtype.InfinityModifier
	ParkedAtInfinity  pgtype.InfinityModifier
}

// Parked returns up to limit parked rows (all of them when limit <= 0),
// oldest first. While a row is parked, the later rows of its ordering key
// are held back. A row whose created_at or parked_at is ±infinity is
// listed like the others, with the infinity in CreatedAtInfinity or
// ParkedAtInfinity.
func (o *Outbox) Parked(ctx context.Context, limit int) ([]ParkedRow, error) {
	q := `SELECT ` + rowColumns + `, last_error, created_at, parked_at FROM ` + o.table + ` WHERE parked_at IS NOT NULL ORDER BY id`
	args := []any{}
	if limit > 0 {
		q += ` LIMIT $1`
		args = append(args, limit)
	}
	rows, err := o.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: parked: %w", err)
	}
	defer rows.Close()
	var out []ParkedRow
	for rows.Next() {
		var p ParkedRow
		// Read through pgtype.Timestamptz, which holds ±infinity: a
		// time.Time cannot, and one such row failed the whole list.
		var created, parked pgtype.Timestamptz
		r, err := scanRow(rows, &p.LastError, &created, &parked)
		if err != nil {
			return nil, fmt.Errorf("outbox: parked: %w", err)
		}
		p.ID, p.Queue, p.Message, p.Attempts = r.id, r.queue, r.msg, r.attempts
		p.CreatedAt, p.CreatedAtInfinity = finiteTime(created)
		p.ParkedAt, p.ParkedAtInfinity = finiteTime(parked)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: parked: %w", err)
	}
	return out, nil
}

// finiteTime splits a timestamptz into its time, zero when it is ±infinity,
// and its infinity (pgtype.Finite for a time).
func finiteTime(ts pgtype.Timestamptz) (time.Time, pgtype.InfinityModifier) {
	if ts.InfinityModifier != pgtype.Finite {
		return time.Time{}, ts.InfinityModifier
	}
	return ts.Time, pgtype.Finite
}

// Requeue puts parked rows back in line, due now with their attempts reset
// (all parked rows when no id is given), and returns how many. If an id is
// not a parked row, nothing is requeued and the error wraps [sdk.ErrNotFound].
func (o *Outbox) Requeue(ctx context.Context, ids ...int64) (int, error) {
	return o.parkedOp(ctx, "requeue", `UPDATE `+o.table+` SET parked_at = NULL, attempts = 0, refusals = 0, available_at = now()`, ids)
}

// Discard deletes parked rows (all parked rows when no id is given): their
// messages are never published. It returns how many; if an id is not a
// parked row, nothing is deleted and the error wraps [sdk.ErrNotFound].
func (o *Outbox) Discard(ctx context.Context, ids ...int64) (int, error) {
	return o.parkedOp(ctx, "discard", `DELETE FROM `+o.table, ids)
}

func (o *Outbox) parkedOp(ctx context.Context, op, stmt string, ids []int64) (int, error) {
	tx, err := o.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: %s: %w", op, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var sel []int64
	if len(ids) > 0 {
		sel = ids
	}
	tag, err := tx.Exec(ctx, stmt+` WHERE parked_at IS NOT NULL AND ($1::bigint[] IS NULL OR id = ANY($1))`, sel)
	if err != nil {
		return 0, fmt.Errorf("outbox: %s: %w", op, err)
	}
	n := int(tag.RowsAffected())
	if len(ids) > 0 {
		distinct := map[int64]bool{}
		for _, id := range ids {
			distinct[id] = true
		}
		if n != len(distinct) {
			return 0, fmt.Errorf("outbox: %s: %d of the %d ids are not parked rows: %w", op, len(distinct)-n, len(distinct), sdk.ErrNotFound)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("outbox: %s: %w", op, err)
	}
	return n, nil
}
