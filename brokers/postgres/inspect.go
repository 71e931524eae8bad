package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/sdk"
)

// Job statuses, the values of the status column.
const (
	StatusQueued     = "queued"
	StatusProcessing = "processing"
	StatusRetry      = "retry"
	StatusCompleted  = "completed"
	StatusFailed     = "failed" // in the reference schema; berth never writes it
	StatusDeadLetter = "dead_letter"
)

var (
	_ sdk.Broker        = (*Broker)(nil)
	_ sdk.QueueDeclarer = (*Broker)(nil)
	_ sdk.Inspector     = (*Broker)(nil)
	_ sdk.DeadLetters   = (*Broker)(nil)
)

// DeclareQueue validates the queue name and records it in the queues table,
// so that [Broker.Stats] reports the queue, empty, instead of
// [sdk.ErrNotFound]. Jobs are rows of the one jobs table, so there is
// nothing else to create; run [Broker.Migrate] (or apply [SchemaSQL], which
// has the queues table since berth's ErrNotFound convention) once.
func (b *Broker) DeclareQueue(ctx context.Context, queue string) error {
	if b.isClosed() {
		return errClosed("declare queue")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return err
	}
	// Recorded so that Stats knows the queue while it is still empty.
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.queues()+` (name) VALUES ($1) ON CONFLICT DO NOTHING`, queue); err != nil {
		return b.wrap(ctx, "declare queue", err)
	}
	return nil
}

// queues is the quoted table of declared queues.
func (b *Broker) queues() string { return quoteIdent(b.schema) + ".queues" }

// queueKnown reports whether queue was declared or holds a job of any status.
// Stats asks only when it counted nothing. The queues table is read first,
// by its key: a declared queue (or one recorded here before) costs that
// lookup alone. Only for a queue not recorded is the jobs table read, for
// a row of any status: no index has every status of a queue (completed
// rows are indexed by updated_at alone), so that read may scan the table,
// for an idle queue that was never declared (once: it is recorded then,
// when the session can write) or an unknown one (at every call).
func (b *Broker) queueKnown(ctx context.Context, queue string) (bool, error) {
	var declared bool
	err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+b.queues()+` WHERE name = $1)`, queue).Scan(&declared)
	if err != nil || declared {
		return declared, err
	}
	var used bool
	if err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+b.table+` WHERE queue = $1)`, queue).Scan(&used); err != nil {
		return false, err
	}
	if used {
		// Only a shortcut for the next call: the answer is known, so a
		// session that cannot write (a read-only role, a standby) or a
		// failed INSERT does not fail the read.
		if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.queues()+` (name) VALUES ($1) ON CONFLICT DO NOTHING`, queue); err != nil {
			b.opts.Logger.Debug("berth/postgres: queue holding jobs not recorded in the queues table", "queue", queue, "err", err)
		}
	}
	return used, nil
}

// Stats reports queue's counts, exactly, in one statement: Ready counts
// queued and retry jobs that are due plus processing jobs whose lease has
// expired (claimable again); Delayed, the queued and retry jobs not yet due;
// InFlight, the processing jobs whose lease runs; DeadLettered, the
// dead_letter jobs. OldestAge is how long the longest-waiting ready job has
// been due (now - available_at), at most the longest [time.Duration] (about
// 292 years): a row due at '-infinity' or centuries ago, written by hand or
// by another tool, gives that longest age rather than an error (now() cannot
// be subtracted from '-infinity') or an overflowed Duration. A row due at
// 'infinity' is counted as Delayed. Completed jobs are not counted (see
// [Broker.CountByStatus]). A queue that was never declared and holds no job
// of any status gives an error wrapping [sdk.ErrNotFound], as on every
// broker.
//
// The counts read the queue's rows through the claim index and the
// dead-letter index (the statuses counted are exactly those the two
// partial indexes hold, so the WHERE names them that way: a condition such
// as status <> 'completed' matches neither, and read the whole table), not
// the table's completed rows. When nothing is counted, a declared queue is
// found in the queues table by its key; only a queue never declared (nor
// recorded by an earlier Stats that found it holding jobs) is looked for
// among the jobs of every status, which no index covers, so that look may
// read the whole table.
func (b *Broker) Stats(ctx context.Context, queue string) (sdk.QueueStats, error) {
	if b.isClosed() {
		return sdk.QueueStats{}, errClosed("stats")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return sdk.QueueStats{}, err
	}
	s := sdk.QueueStats{Queue: queue}
	var oldestUS int64
	err := b.pool.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE status IN ('queued', 'retry', 'processing') AND available_at <= now()),
			count(*) FILTER (WHERE status IN ('queued', 'retry') AND available_at > now()),
			count(*) FILTER (WHERE status = 'processing' AND available_at > now()),
			count(*) FILTER (WHERE status = 'dead_letter'),
			COALESCE((extract(epoch FROM now() - min(greatest(available_at, now() - $2 * interval '1 microsecond'))
				FILTER (WHERE status IN ('queued', 'retry', 'processing') AND available_at <= now())) * 1e6)::bigint, 0)
		FROM `+b.table+` WHERE queue = $1 AND (status IN ('queued', 'retry', 'processing') OR status = 'dead_letter')`, queue, maxAgeMicros).
		Scan(&s.Ready, &s.Delayed, &s.InFlight, &s.DeadLettered, &oldestUS)
	if err != nil {
		return sdk.QueueStats{}, b.wrap(ctx, "stats", err)
	}
	// Clamped again: PostgreSQL's interval arithmetic may round the clamped
	// age up by a microsecond.
	s.OldestAge = time.Duration(min(oldestUS, maxAgeMicros)) * time.Microsecond
	if s.Ready+s.Delayed+s.InFlight+s.DeadLettered == 0 {
		known, err := b.queueKnown(ctx, queue)
		if err != nil {
			return sdk.QueueStats{}, b.wrap(ctx, "stats", err)
		}
		if !known {
			return sdk.QueueStats{}, fmt.Errorf("berth/postgres: stats of queue %q, never declared and holding no job: %w", queue, sdk.ErrNotFound)
		}
	}
	return s, nil
}

// maxAgeMicros is the longest age Stats reports, in microseconds: the
// longest time.Duration. Each row's due time is clamped to now() minus it
// before it is subtracted from now(), which '-infinity' cannot be.
const maxAgeMicros = int64(math.MaxInt64 / time.Microsecond)

// CountByStatus returns queue's job count per status column value (statuses
// with no job are absent).
func (b *Broker) CountByStatus(ctx context.Context, queue string) (map[string]int64, error) {
	if b.isClosed() {
		return nil, errClosed("count by status")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	rows, err := b.pool.Query(ctx, `SELECT status, count(*) FROM `+b.table+` WHERE queue = $1 GROUP BY status`, queue)
	if err != nil {
		return nil, b.wrap(ctx, "count by status", err)
	}
	counts := make(map[string]int64)
	var (
		status string
		n      int64
	)
	_, err = pgx.ForEachRow(rows, []any{&status, &n}, func() error { counts[status] = n; return nil })
	if err != nil {
		return nil, b.wrap(ctx, "count by status", err)
	}
	return counts, nil
}

const deadLetterColumns = `message_id, job_type, payload, headers, correlation_id, ordering_key, COALESCE(idempotency_key, '')`

func scanMessage(row pgx.Row) (*sdk.Message, error) {
	m := &sdk.Message{}
	var headers []byte
	if err := row.Scan(&m.ID, &m.Type, &m.Body, &headers, &m.CorrelationID, &m.Key, &m.IdempotencyKey); err != nil {
		return nil, err
	}
	m.Headers, _ = parseHeaders(headers)
	if m.Body == nil {
		m.Body = []byte{}
	}
	return m, nil
}

// ListDeadLetters returns up to limit (default 100) of queue's dead letters,
// the earliest dead-lettered first, with their dead-letter headers.
func (b *Broker) ListDeadLetters(ctx context.Context, queue string, limit int) ([]*sdk.Message, error) {
	if b.isClosed() {
		return nil, errClosed("list dead letters")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = sdk.DefaultListLimit
	}
	rows, err := b.pool.Query(ctx, `SELECT `+deadLetterColumns+` FROM `+b.table+`
		WHERE queue = $1 AND status = 'dead_letter' ORDER BY updated_at, id LIMIT $2`, queue, limit)
	if err != nil {
		return nil, b.wrap(ctx, "list dead letters", err)
	}
	msgs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*sdk.Message, error) { return scanMessage(r) })
	if err != nil {
		return nil, b.wrap(ctx, "list dead letters", err)
	}
	return msgs, nil
}

// GetDeadLetter returns the dead letter of queue whose message ID is id, or
// an error wrapping [sdk.ErrNotFound].
func (b *Broker) GetDeadLetter(ctx context.Context, queue, id string) (*sdk.Message, error) {
	if b.isClosed() {
		return nil, errClosed("get dead letter")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	if id, bad := unstorableID(id); bad {
		return nil, fmt.Errorf("berth/postgres: dead letter %s of %s: %w", sdk.ErrorText(id), queue, sdk.ErrNotFound)
	}
	m, err := scanMessage(b.pool.QueryRow(ctx, `SELECT `+deadLetterColumns+` FROM `+b.table+`
		WHERE queue = $1 AND status = 'dead_letter' AND message_id = $2 ORDER BY id LIMIT 1`, queue, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("berth/postgres: dead letter %s of %s: %w", sdk.ErrorText(id), queue, sdk.ErrNotFound)
	}
	if err != nil {
		return nil, b.wrap(ctx, "get dead letter", err)
	}
	return m, nil
}

// CountDeadLetters returns how many of queue's dead letters have the
// message ID id: [Broker.RedriveDeadLetters] and
// [Broker.DeleteDeadLetters] given id move every one of them. One indexed
// statement (jobs_dead_letter_idx).
func (b *Broker) CountDeadLetters(ctx context.Context, queue, id string) (int, error) {
	if b.isClosed() {
		return 0, errClosed("count dead letters")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return 0, err
	}
	if _, bad := unstorableID(id); bad {
		return 0, nil // no row can hold it
	}
	var n int
	err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table+`
		WHERE queue = $1 AND status = 'dead_letter' AND message_id = $2`, queue, id).Scan(&n)
	if err != nil {
		return 0, b.wrap(ctx, "count dead letters", err)
	}
	return n, nil
}

// CountDeadLettersByID returns, for each of ids that dead letters of queue
// hold, how many do (an ID none holds is left out): what
// [Broker.CountDeadLetters] returns for each, in one statement on
// jobs_dead_letter_idx (the IDs joined, as RedriveDeadLetters joins them).
func (b *Broker) CountDeadLettersByID(ctx context.Context, queue string, ids []string) (map[string]int, error) {
	if b.isClosed() {
		return nil, errClosed("count dead letters")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	n := make(map[string]int, len(ids))
	seen := make(map[string]bool, len(ids))
	chosen := make([]string, 0, len(ids))
	for _, id := range ids {
		if _, bad := unstorableID(id); !bad && !seen[id] { // no row can hold an unstorable one
			seen[id] = true
			chosen = append(chosen, id)
		}
	}
	if len(chosen) == 0 {
		return n, nil
	}
	rows, err := b.pool.Query(ctx, `SELECT j.message_id, count(*) FROM unnest($2::text[]) AS chosen(id)
		JOIN `+b.table+` j ON j.queue = $1 AND j.status = 'dead_letter' AND j.message_id = chosen.id
		GROUP BY j.message_id`, queue, chosen)
	if err != nil {
		return nil, b.wrap(ctx, "count dead letters", err)
	}
	var (
		id string
		k  int
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &k}, func() error { n[id] = k; return nil }); err != nil {
		return nil, b.wrap(ctx, "count dead letters", err)
	}
	return n, nil
}

// RedriveDeadLetters puts dead letters of queue back to 'queued' in place:
// attempt_count reset to 0, due now, the dead-letter headers (the
// berth-dlq-truncated marker too) removed and
// berth-redrive-count incremented (as [sdk.PrepareRedrive] does); last_error
// is kept for the record. With no ids it redrives them all. If any id is not
// a dead letter of queue, nothing is redriven and the error wraps
// [sdk.ErrNotFound].
func (b *Broker) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	if b.isClosed() {
		return 0, errClosed("redrive dead letters")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return 0, err
	}
	if id, bad := unstorableID(ids...); bad {
		return 0, fmt.Errorf("berth/postgres: redrive dead letter %s of %s: %w", sdk.ErrorText(id), queue, sdk.ErrNotFound)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return 0, b.wrap(ctx, "redrive dead letters", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// Two statements, not one with "$2 IS NULL OR message_id = ANY($2)": the
	// OR keeps message_id out of the index condition, so a redrive of a few
	// IDs read every dead letter of the queue (the CLI's page-by-page redrive
	// of 100,000 became quadratic). The IDs are joined (FROM unnest), not
	// compared with = ANY($2): without table statistics a generic plan
	// filters every dead letter through the array one element at a time
	// (464 ms for 500 IDs among 70,000, against 33 ms joined).
	// A redrive of them all returns no IDs (RETURNING 1): the count is all
	// it needs, and a queue of millions of dead letters must not have all
	// their IDs read into memory to be counted.
	from, chosen, returning := ``, `$2::text[] IS NULL`, `1`
	if len(ids) > 0 {
		from, chosen, returning = `FROM unnest($2::text[]) AS chosen(id)`, `message_id = chosen.id`, `message_id`
	}
	rows, err := tx.Query(ctx, `UPDATE `+b.table+` SET
			status = 'queued', attempt_count = 0, available_at = now(), visibility_until = NULL,
			lease_token = NULL, first_failure_at = NULL, updated_at = now(),
			headers = (`+fmt.Sprintf(objectHeadersSQL, "headers", "headers")+` - $3::text[]) || jsonb_build_object('`+sdk.HeaderRedriveCount+`',
				(CASE WHEN headers->>'`+sdk.HeaderRedriveCount+`' ~ '^[0-9]{1,9}$'
					THEN (headers->>'`+sdk.HeaderRedriveCount+`')::int ELSE 0 END + 1)::text)
		`+from+`
		WHERE queue = $1 AND status = 'dead_letter' AND `+chosen+`
		RETURNING `+returning, queue, nilIfEmpty(ids), []string{
		sdk.HeaderDeadLetterReason, sdk.HeaderDeadLetterClass, sdk.HeaderDeadLetterAttempts,
		sdk.HeaderDeadLetterQueue, sdk.HeaderFirstFailure, sdk.HeaderLastFailure, sdk.HeaderAttempt, sdk.HeaderDeadLetterTruncated})
	if err != nil {
		return 0, b.wrap(ctx, "redrive dead letters", err)
	}
	var (
		n     int
		found = make(map[string]bool, len(ids))
		id    string
	)
	dest := []any{nil}
	if len(ids) > 0 {
		dest[0] = &id
	}
	_, err = pgx.ForEachRow(rows, dest, func() error {
		n++
		if len(ids) > 0 {
			found[id] = true
		}
		return nil
	})
	if err != nil {
		return 0, b.wrap(ctx, "redrive dead letters", err)
	}
	for _, id := range ids {
		if !found[id] {
			return 0, fmt.Errorf("berth/postgres: redrive dead letter %s of %s: %w", sdk.ErrorText(id), queue, sdk.ErrNotFound)
		}
	}
	if n > 0 {
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, b.channel, queue); err != nil {
			return 0, b.wrap(ctx, "redrive dead letters", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, b.wrap(ctx, "redrive dead letters", err)
	}
	return n, nil
}

// PurgeDeadLetters deletes queue's dead letters and returns how many.
func (b *Broker) PurgeDeadLetters(ctx context.Context, queue string) (int, error) {
	if b.isClosed() {
		return 0, errClosed("purge dead letters")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return 0, err
	}
	tag, err := b.pool.Exec(ctx, `DELETE FROM `+b.table+` WHERE queue = $1 AND status = 'dead_letter'`, queue)
	if err != nil {
		return 0, b.wrap(ctx, "purge dead letters", err)
	}
	return int(tag.RowsAffected()), nil
}

// DeleteCompleted deletes completed jobs (of every queue) last updated more
// than olderThan ago, batch rows per statement (default 1000) so that no
// statement holds many locks or runs long, until none is left. It returns
// the number deleted; on error, the count of the batches that were committed.
func (b *Broker) DeleteCompleted(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	if b.isClosed() {
		return 0, errClosed("delete completed")
	}
	if batch <= 0 {
		batch = DefaultRetentionBatch
	}
	var total int64
	for {
		tag, err := b.pool.Exec(ctx, `DELETE FROM `+b.table+` WHERE id IN (
				SELECT id FROM `+b.table+`
				WHERE status = 'completed' AND updated_at < now() - $1 * interval '1 microsecond'
				LIMIT $2 FOR UPDATE SKIP LOCKED)`, max(olderThan, 0).Microseconds(), batch)
		if err != nil {
			return total, b.wrap(ctx, "delete completed", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}

// retentionLoop runs DeleteCompleted every RetentionInterval until Close,
// or until the application has closed the pool: nothing comes from a
// closed pool again, so the loop stops (logging that once) rather than
// failing, and logging the failure, at every interval.
func (b *Broker) retentionLoop(ctx context.Context) {
	t := time.NewTicker(b.opts.RetentionInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := b.DeleteCompleted(ctx, b.opts.Retention, b.opts.RetentionBatch)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, sdk.ErrClosed):
			b.opts.Logger.Info("berth/postgres: retention stopped: the pool is closed", "schema", b.schema, "deleted", n)
			return
		case err != nil:
			b.opts.Logger.Warn("berth/postgres: retention failed", "schema", b.schema, "deleted", n, "err", err)
		case n > 0:
			b.opts.Logger.Debug("berth/postgres: retention deleted completed jobs", "schema", b.schema, "deleted", n)
		}
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}
