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
// package idempotency). Relays running side by side take disjoint batches
// (FOR UPDATE SKIP LOCKED), so they do not publish the same row concurrently.
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
	"strings"
	"time"

	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
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
// migrations themselves.
func (o *Outbox) SchemaSQL() string {
	schema := pgx.Identifier{o.ident[0]}.Sanitize()
	idx := pgx.Identifier{o.ident[1] + "_pending_idx"}.Sanitize()
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
CREATE INDEX IF NOT EXISTS %[3]s ON %[2]s (available_at, id);
`, schema, o.table, idx)
}

// Migrate creates the outbox table if it does not exist.
func (o *Outbox) Migrate(ctx context.Context) error {
	_, err := o.pool.Exec(ctx, o.SchemaSQL())
	return err
}

// Add writes msgs for queue inside tx, the caller's business transaction.
// They are published after tx commits, and never if it rolls back. Add fills
// message IDs and correlation IDs now (see [sdk.Prepare]), so the IDs the
// consumer sees are the ones the producer's transaction recorded.
func (o *Outbox) Add(ctx context.Context, tx pgx.Tx, queue string, msgs ...*sdk.Message) error {
	if err := sdk.PrepareAll(ctx, queue, msgs, o.limit); err != nil {
		return err
	}
	batch := &pgx.Batch{}
	q := `INSERT INTO ` + o.table + ` (queue, message_id, job_type, idempotency_key, ordering_key, correlation_id, headers, body, delay_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	for _, m := range msgs {
		if o.onAdd != nil {
			o.onAdd(ctx, m)
		}
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

// RelayOptions configures Relay.
type RelayOptions struct {
	BatchSize    int           // rows per transaction; default 100
	PollInterval time.Duration // wait when the outbox is empty; default 200ms
	// Backoff paces retries of rows whose publish failed. Default
	// sdk.DefaultBackoff.
	Backoff sdk.Backoff
	Logger  *slog.Logger // default slog.Default()
}

// Relay publishes committed outbox rows to pub until ctx is done, then
// returns nil. Failed publishes are retried with backoff; the rows stay in
// the table until the broker accepts them.
func (o *Outbox) Relay(ctx context.Context, pub sdk.Publisher, opts RelayOptions) error {
	if opts.PollInterval <= 0 {
		opts.PollInterval = 200 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 100
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		n, err := o.RelayOnce(ctx, pub, opts)
		wait := opts.PollInterval
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			opts.Logger.Warn("outbox: relay batch failed; rows stay for a retry", "table", o.table, "err", err)
		case n == opts.BatchSize:
			wait = 0 // a full batch: there is probably more
		}
		timer.Reset(wait)
	}
}

type row struct {
	id    int64
	queue string
	msg   *sdk.Message
}

// RelayOnce publishes one batch of due rows and deletes them, in one
// transaction, and returns how many it published. Rows locked by another
// relay are skipped.
func (o *Outbox) RelayOnce(ctx context.Context, pub sdk.Publisher, opts RelayOptions) (int, error) {
	if opts.BatchSize <= 0 {
		opts.BatchSize = 100
	}
	tx, err := o.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	rows, err := tx.Query(ctx, `SELECT id, queue, message_id, job_type, idempotency_key, ordering_key, correlation_id, headers, body, delay_ms
FROM `+o.table+` WHERE available_at <= now() ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, opts.BatchSize)
	if err != nil {
		return 0, err
	}
	var batch []row
	for rows.Next() {
		var r row
		var headers []byte
		var delayMS int64
		m := &sdk.Message{}
		if err := rows.Scan(&r.id, &r.queue, &m.ID, &m.Type, &m.IdempotencyKey, &m.Key, &m.CorrelationID, &headers, &m.Body, &delayMS); err != nil {
			rows.Close()
			return 0, err
		}
		if err := json.Unmarshal(headers, &m.Headers); err != nil {
			rows.Close()
			return 0, fmt.Errorf("outbox: row %d headers: %w", r.id, err)
		}
		if len(m.Headers) == 0 {
			m.Headers = nil
		}
		m.Delay = time.Duration(delayMS) * time.Millisecond
		r.msg = m
		batch = append(batch, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(batch) == 0 {
		return 0, nil
	}

	// Publish per queue, keeping row order within each queue.
	var done []int64
	var failed []int64
	var pubErr error
	for _, group := range groupByQueue(batch) {
		msgs := make([]*sdk.Message, len(group))
		for i, r := range group {
			msgs[i] = r.msg
		}
		if err := pub.Publish(ctx, group[0].queue, msgs...); err != nil {
			pubErr = errors.Join(pubErr, err)
			var pe *sdk.PublishError
			for _, r := range group {
				if errors.As(err, &pe) && pe.Failed[r.msg.ID] == nil {
					done = append(done, r.id) // accepted by the broker
				} else {
					failed = append(failed, r.id)
				}
			}
			continue
		}
		for _, r := range group {
			done = append(done, r.id)
		}
	}
	if len(done) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM `+o.table+` WHERE id = ANY($1)`, done); err != nil {
			return 0, err
		}
	}
	if len(failed) > 0 {
		// Postpone failed rows so one bad row does not block the table.
		delay := opts.Backoff.Delay(1, 0)
		if _, err := tx.Exec(ctx, `UPDATE `+o.table+` SET attempts = attempts + 1, last_error = $2,
available_at = now() + make_interval(secs => least(($3::float8 * power(2, attempts)), $4::float8)) WHERE id = ANY($1)`,
			failed, truncate(pubErr.Error(), 1000), delay.Seconds(), opts.Backoff.Delay(64, 0).Seconds()); err != nil {
			return 0, errors.Join(pubErr, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, errors.Join(pubErr, err)
	}
	return len(done), pubErr
}

func groupByQueue(rows []row) [][]row {
	var order []string
	groups := map[string][]row{}
	for _, r := range rows {
		if _, ok := groups[r.queue]; !ok {
			order = append(order, r.queue)
		}
		groups[r.queue] = append(groups[r.queue], r)
	}
	out := make([][]row, len(order))
	for i, q := range order {
		out[i] = groups[q]
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// Pending returns how many messages wait in the outbox.
func (o *Outbox) Pending(ctx context.Context) (int64, error) {
	var n int64
	err := o.pool.QueryRow(ctx, `SELECT count(*) FROM `+o.table).Scan(&n)
	return n, err
}
