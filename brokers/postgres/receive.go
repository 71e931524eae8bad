package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/sdk"
)

// minWait is the shortest Receive sleeps between two looks at the table, so
// that a due job locked by another claimer does not make it spin.
const minWait = 10 * time.Millisecond

// rfc3339SQL formats a timestamptz the way sdk.AnnotateDeadLetter does (UTC,
// time.RFC3339Nano: the fraction without its trailing zeros, none for a
// whole second), so that one instant reads as one header string whichever
// path wrote it (the claim's SQL, DeadLetter's Go and SQL, other brokers).
// It is NULL for NULL.
const rfc3339SQL = `(rtrim(rtrim(to_char(%s AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), '0'), '.') || 'Z')`

// headerFirstFailureSQL is the berth-first-failure header of row j as a
// timestamptz when it is an RFC 3339 time as sdk.AnnotateDeadLetter reads one
// (time.Parse with time.RFC3339Nano: "T" and "Z" in capitals, a fraction of
// any length after "." or ",", an offset of at most 24:60, every date and
// time field in range), else NULL. The fraction is cut to microseconds, as
// PostgreSQL keeps them; a time before year 1 (UTC), which to_char cannot
// write, is NULL too. It never fails: a header the claim cannot read must
// not fail the claim of every row with it. The caller checks it is not after
// now().
const headerFirstFailureSQL = `(SELECT CASE
	WHEN m IS NULL THEN NULL
	WHEN m[1]::int < 1 OR m[2]::int NOT BETWEEN 1 AND 12 OR m[3]::int < 1 OR m[4]::int > 23 OR m[5]::int > 59
		OR m[6]::int > 59 OR COALESCE(m[10]::int > 24 OR m[11]::int > 60, false) THEN NULL
	WHEN m[3]::int > extract(day FROM make_date(m[1]::int, m[2]::int, 1) + interval '1 month - 1 day') THEN NULL
	ELSE NULLIF(GREATEST(make_timestamp(m[1]::int, m[2]::int, m[3]::int, m[4]::int, m[5]::int,
			(m[6] || '.' || rpad(COALESCE(left(m[7], 6), ''), 6, '0'))::float8) AT TIME ZONE 'UTC'
		- CASE m[9] WHEN '-' THEN -1 ELSE 1 END * make_interval(hours => COALESCE(m[10]::int, 0), mins => COALESCE(m[11]::int, 0)),
		'0001-01-01 00:00:00+00'::timestamptz - interval '1 microsecond'), '0001-01-01 00:00:00+00'::timestamptz - interval '1 microsecond')
	END FROM (SELECT regexp_match(j.headers->>'` + sdk.HeaderFirstFailure + `',
		'^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:[.,]([0-9]+))?(Z|([+-])([0-9]{2}):([0-9]{2}))$') AS m) r)`

// Receive claims between 1 and max jobs of queue, waiting while none is
// available: it wakes on a NOTIFY from Publish, Retry or Release (delayed
// ones too: a Receive woken looks at the table and sleeps again until the
// new earliest due time), at the due time of the earliest delayed job or
// expiring lease, and at least every Options.PollInterval. Claimed rows become
// 'processing' with attempt_count+1, a lease of Options.Lease, this broker's
// worker_id and a fresh lease_token. A job already claimed max_attempts times
// is dead-lettered instead, with cause [sdk.ErrMaxDeliveries], and not
// returned.
//
// Receive may be called concurrently (FOR UPDATE SKIP LOCKED keeps claimers
// apart). It returns ctx.Err() when ctx is done, [sdk.ErrClosed] after Close,
// and an error wrapping [sdk.ErrUnavailable] when the database cannot be
// reached (the caller retries). Jobs it claimed for a caller whose ctx ended,
// or across a Close, are handed back (no attempt counted), not returned; so
// are, in the background, the jobs of a claim whose reply was lost with its
// connection (see recoverClaim). A
// Receive waiting for a pooled connection returns when ctx ends or at Close.
// A claimed row that cannot be decoded is handed back at once, no attempt
// counted, and logged; the others are delivered, and a claim that took only
// such rows returns a [*DecodeError]. Once the application has closed the
// pool, Receive (like every operation) returns [sdk.ErrClosed].
func (b *Broker) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	if b.isClosed() {
		return nil, errClosed("receive")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	if max < 1 {
		max = 1
	}
	b.startListening()
	for {
		woken := b.wake.wait(queue)
		ds, poisoned, err := b.claim(ctx, queue, max)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		if len(ds) > 0 {
			return ds, nil
		}
		if poisoned > 0 {
			continue
		}
		wait, err := b.nextDue(ctx, queue)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-b.closed:
			t.Stop()
			return nil, errClosed("receive")
		case <-woken:
			t.Stop()
		case <-t.C:
		}
	}
}

// nextDue returns how long to sleep before the next look at queue: until its
// earliest due time (delayed job, retry, lease expiry), within
// [minWait, PollInterval]. The due time is clamped to that range in SQL: a
// row parked by hand at 'infinity' (which now() cannot be subtracted from)
// or centuries ahead (more microseconds than a time.Duration holds) must
// not fail every Receive of the queue, nor make it poll every minWait.
func (b *Broker) nextDue(ctx context.Context, queue string) (time.Duration, error) {
	var us *int64
	err := b.pool.QueryRow(ctx, `SELECT (extract(epoch FROM
			greatest(least(min(available_at), now() + $2 * interval '1 microsecond'), now()) - now()) * 1e6)::bigint
		FROM `+b.table+` WHERE queue = $1 AND status IN ('queued', 'retry', 'processing')`,
		queue, b.opts.PollInterval.Microseconds()).Scan(&us)
	if err != nil {
		return 0, b.wrap(ctx, "receive", err)
	}
	wait := b.opts.PollInterval
	if us != nil {
		wait = min(wait, time.Duration(*us)*time.Microsecond)
	}
	return max(wait, minWait), nil
}

// objectHeadersSQL is the headers column (the expression given twice) when
// it holds a JSON object, else an empty object: the headers of a row written
// by hand or by another tool may be any JSON (null, which a Go tool writes
// for a nil map, a string, a number, an array), which the broker delivers
// and lists without headers (parseHeaders). Headers added with || to such a
// value would make an array of it, which reads as no headers at all, and
// jsonb - text[] fails on a scalar.
const objectHeadersSQL = `(CASE WHEN jsonb_typeof(%s) = 'object' THEN %s ELSE '{}'::jsonb END)`

// poisonReason is the dead-letter reason of a job the claim finds past
// max_attempts: "max deliveries exceeded", then the last Retry's cause, so
// the real error is not lost; at most 256 characters (1024 bytes, as
// sdk.SanitizeReason bounds a reason).
const poisonReason = `left($5::text || COALESCE('; last error: ' || j.last_error, ''), 256)`

// claim runs the claim statement once, for a caller whose context is ctx.
//
// The claim commits rows to this caller, so ctx must not cut it: a claim
// cancelled after the server ran it would leave its rows leased to nobody,
// back only after the lease with an attempt consumed (seen under rolling
// SIGTERMs, RELIABILITY.md). It is one short statement, bounded by its own
// b.claimTimeout instead; when that runs out while ctx is live, the error
// wraps [sdk.ErrUnavailable]. Rows claimed for a caller that has gone
// meanwhile, or across a Close, are handed back (see handBack), and claim
// returns ctx.Err() or [sdk.ErrClosed].
//
// Waiting for a pooled connection is not the claim: ctx and Close end that
// wait (as does the claim limit), so a Receive whose pool is exhausted
// (every connection held by handlers) returns when its caller goes or the
// broker is closed, and takes no job.
func (b *Broker) claim(ctx context.Context, queue string, max int) (ds []sdk.Delivery, poisoned int, err error) {
	actx, acancel := context.WithTimeout(ctx, b.claimTimeout)
	stop := context.AfterFunc(b.life, acancel)
	conn, err := b.pool.Acquire(actx)
	stop()
	acancel()
	if err != nil {
		return nil, 0, b.wrap(ctx, "receive", err)
	}
	defer conn.Release()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.claimTimeout)
	defer cancel()
	// The claim's lease token, chosen here rather than by the server, so
	// that rows claimed by a statement whose reply is lost can be found
	// and handed back (see recoverClaim).
	token := uuid.NewString()
	pid := conn.Conn().PgConn().PID()
	now := fmt.Sprintf(rfc3339SQL, "now()")
	// The first failure is the row's own first_failure_at when set: a
	// berth-first-failure header already on the row (written by hand or by
	// another tool; Publish refuses berth- headers) only fills in for a row
	// that has none, and may be stale or forged, so it is kept only as
	// sdk.AnnotateDeadLetter keeps one (see headerFirstFailureSQL), else now.
	first := `COALESCE(` + fmt.Sprintf(rfc3339SQL, "j.first_failure_at") + `, (SELECT ` + fmt.Sprintf(rfc3339SQL, "h.t") +
		` FROM (SELECT ` + headerFirstFailureSQL + ` AS t) h WHERE h.t <= now()), ` + fmt.Sprintf(rfc3339SQL, "now()") + `)`
	// The lease runs from clock_timestamp() when the claim takes the row,
	// not from now(), the start of its transaction: a claim that waited
	// for the table (behind a migration's CREATE INDEX, say) longer than
	// the lease would hand out jobs whose lease was already over, and the
	// next claim of any worker would take them again at once.
	q := `WITH c AS (
		SELECT id, attempt_count >= max_attempts AND pg_column_size(message_id) + octet_length(queue) <= $8 AS poison,
			attempt_count >= max_attempts AND pg_column_size(message_id) + octet_length(queue) > $8 AS stuck,
			clock_timestamp() AS taken
		FROM ` + b.table + `
		WHERE queue = $1 AND status IN ('queued', 'retry', 'processing') AND available_at <= now()
		ORDER BY available_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED
	)
	UPDATE ` + b.table + ` AS j SET
		status           = CASE WHEN c.poison THEN 'dead_letter' ELSE 'processing' END,
		attempt_count    = CASE WHEN c.poison THEN j.attempt_count ELSE j.attempt_count + 1 END,
		available_at     = CASE WHEN c.poison THEN j.available_at ELSE c.taken + $3 * interval '1 microsecond' END,
		visibility_until = CASE WHEN c.poison THEN NULL ELSE c.taken + $3 * interval '1 microsecond' END,
		lease_token      = CASE WHEN c.poison THEN NULL ELSE $7::uuid END,
		worker_id        = $4,
		last_error       = CASE WHEN c.poison THEN ` + poisonReason + ` ELSE j.last_error END,
		first_failure_at = CASE WHEN c.poison THEN COALESCE(j.first_failure_at, now()) ELSE j.first_failure_at END,
		headers          = CASE WHEN c.poison THEN (` + fmt.Sprintf(objectHeadersSQL, "j.headers", "j.headers") + ` - '` + sdk.HeaderDeadLetterTruncated + `') || jsonb_build_object(
			'` + sdk.HeaderDeadLetterReason + `', ` + poisonReason + `,
			'` + sdk.HeaderDeadLetterClass + `', $6::text,
			'` + sdk.HeaderDeadLetterAttempts + `', j.attempt_count::text,
			'` + sdk.HeaderDeadLetterQueue + `', j.queue,
			'` + sdk.HeaderFirstFailure + `', ` + first + `,
			'` + sdk.HeaderLastFailure + `', ` + now + `)
			ELSE j.headers END,
		updated_at       = now()
	FROM c
	WHERE j.id = c.id
	RETURNING c.poison, j.id, j.message_id, j.job_type, j.payload, j.headers, j.correlation_id,
		j.ordering_key, COALESCE(j.idempotency_key, ''), j.attempt_count, COALESCE(j.lease_token::text, ''),
		j.first_failure_at, c.stuck`
	rows, err := conn.Query(cctx, q, queue, max, b.opts.Lease.Microseconds(), b.opts.WorkerID,
		sdk.ErrMaxDeliveries.Error(), string(sdk.Classify(sdk.ErrMaxDeliveries)), token, maxDeadLetterKey)
	if err != nil {
		b.recoverClaim(conn, queue, token, pid, err)
		return nil, 0, b.wrap(ctx, "receive", err)
	}
	defer rows.Close()
	// Each row is decoded from its raw values (pgx.ScanRow), not with
	// rows.Scan, which ends the iteration at the first value it cannot
	// decode: the claim has committed every row it took, and one row
	// holding a value the broker's Go types cannot (written by hand or by
	// another tool: a first_failure_at of 'infinity', say) must not leave
	// the others, unread, leased to nobody with an attempt spent.
	fields, typeMap := rows.FieldDescriptions(), conn.Conn().TypeMap()
	var (
		bad    []int64 // claimed rows that could not be decoded
		badErr error   // the first one's decode error
	)
	for rows.Next() {
		var (
			poison  bool
			stuck   bool
			d       = &delivery{b: b, queue: queue, msg: &sdk.Message{}}
			headers []byte
			first   *time.Time
			values  = rows.RawValues()
		)
		// The poison and stuck flags and the id are computed by the claim and never
		// NULL; the rest comes from the row as it was written.
		last := len(fields) - 1
		if err := pgx.ScanRow(typeMap, append(fields[:2:2], fields[last]), append(values[:2:2], values[last]),
			&poison, &d.id, &stuck); err != nil {
			return nil, 0, b.wrap(ctx, "receive", err)
		}
		err := pgx.ScanRow(typeMap, fields, values, nil, nil, &d.msg.ID, &d.msg.Type, &d.msg.Body, &headers,
			&d.msg.CorrelationID, &d.msg.Key, &d.msg.IdempotencyKey, &d.attempt, &d.token, &first, nil)
		if stuck && err == nil {
			// At its attempt cap, but its message ID (from a row written
			// by hand, by another tool or before Publish bounded IDs) is
			// longer than the dead letters' index holds: dead-lettering it
			// would fail the claim, and so every claim of the queue, for
			// ever. It is handed back as a row that cannot be decoded is.
			err = fmt.Errorf("job %d at its attempt cap cannot be dead-lettered: its message ID of %d bytes is too long for an entry of the dead letters' index (%d bytes, compressed, with the queue name; shorten or delete it in SQL)",
				d.id, len(d.msg.ID), btreeMaxEntry)
		}
		if poison {
			// Already dead-lettered by the claim: nothing to hand back.
			poisoned++
			b.opts.Logger.Warn("berth/postgres: job dead-lettered at claim: max deliveries exceeded",
				"queue", queue, "job_id", d.id, sdk.LogText("message_id", d.msg.ID), "attempts", d.attempt) // the ID is the producer's
			continue
		}
		if err != nil {
			if badErr == nil {
				badErr = err
			}
			bad = append(bad, d.id)
			b.opts.Logger.Warn("berth/postgres: claimed job cannot be decoded; handed back (no attempt counted)",
				"queue", queue, "job_id", d.id, "err", err)
			continue
		}
		var exact bool
		if d.msg.Headers, exact = parseHeaders(headers); !exact {
			// Not berth's own: a hand-written row. Failing the claim here
			// would leave every row it took leased to nobody, an attempt
			// spent, claim after claim, until all were dead-lettered unrun.
			b.opts.Logger.Warn("berth/postgres: job headers are not a JSON object of strings; delivered as text",
				"queue", queue, "job_id", d.id)
		}
		if d.msg.Body == nil {
			d.msg.Body = []byte{}
		}
		if first != nil {
			d.firstFailure = *first
		}
		ds = append(ds, d)
	}
	if err := rows.Err(); err != nil {
		// Either the statement failed as a whole (nothing was claimed), or
		// the connection failed while its reply was read, and the server
		// may have committed the claim: recoverClaim tells them apart.
		b.recoverClaim(conn, queue, token, pid, err)
		return nil, 0, b.wrap(ctx, "receive", err)
	}
	if len(ds)+len(bad) > 0 && (ctx.Err() != nil || b.isClosed()) {
		// Nobody can settle them: the caller went, or Close came while
		// the claim ran (every settlement is then ErrClosed).
		ids := append([]int64(nil), bad...)
		for _, d := range ds {
			ids = append(ids, d.(*delivery).id)
		}
		b.handBack(ctx, conn, queue, token, ids, true)
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		return nil, 0, errClosed("receive")
	}
	if len(bad) > 0 {
		// Due at once, no attempt counted, but no NOTIFY: the waiting
		// Receive calls would only claim them again and fail. The rows
		// decoded are delivered; with none, the caller gets the error.
		b.handBack(ctx, conn, queue, token, bad, false)
		if len(ds) == 0 {
			return nil, 0, &DecodeError{Queue: queue, JobIDs: bad, Err: badErr}
		}
	}
	return ds, poisoned, nil
}

// btreeMaxEntry is the largest btree index entry PostgreSQL holds (8 kB
// pages): the dead letters' index entry is the queue name and the message
// ID, as stored (compressed when it is long and compresses).
const btreeMaxEntry = 2704

// maxDeadLetterKey bounds pg_column_size(message_id) + octet_length(queue)
// of a row the claim dead-letters: btreeMaxEntry less the entry's header,
// the name's length byte and the alignment padding. A row over it (an ID
// written around Publish's MaxIndexedLength) would fail the claim with
// SQLSTATE 54000; one under it, however long its ID, is dead-lettered
// (MaxIndexedLength is Publish's bound, not the index's: an ID of 2500
// bytes, or a long one that compresses, fits).
const maxDeadLetterKey = btreeMaxEntry - 24

// DecodeError is the error of a Receive whose claim took only jobs whose
// row could not be decoded into a delivery: a value the broker's Go types
// cannot hold, written by hand or by another tool (a first_failure_at of
// 'infinity', say). Those rows were handed back at once, due now, with
// their attempt not counted (they were not run), so they are not stranded
// for a lease nor dead-lettered by a cap they never ran into; the job ids
// tell which rows to fix (or dead-letter, or delete) in SQL. A claim that
// also took rows that decode delivers those, and logs the others (same
// hand-back), instead of returning this error. A row at its attempt cap
// whose message ID is too long for an index entry, which cannot be
// dead-lettered, is handed back and reported so too (Err says why). Use
// errors.As to get it; Err (a [pgx.ScanArgError], which names the column,
// for a row that cannot be decoded) is in the chain.
type DecodeError struct {
	Queue  string  // the queue received from
	JobIDs []int64 // the rows' ids in the jobs table
	Err    error   // the first row's decode error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("berth/postgres: receive from %s: %d claimed job(s) cannot be decoded, handed back (job ids %v): %v",
		e.Queue, len(e.JobIDs), e.JobIDs, e.Err)
}

// Unwrap returns the decode error.
func (e *DecodeError) Unwrap() error { return e.Err }

// delivery is one claimed row. Its settlements are fenced by the lease token.
type delivery struct {
	b            *Broker
	id           int64
	token        string
	queue        string
	msg          *sdk.Message
	attempt      int
	firstFailure time.Time

	mu      sync.Mutex
	settled bool
	acking  bool // an AckAsync is in flight: other settlements are refused (ExtendLease is not)
}

var (
	_ sdk.Delivery   = (*delivery)(nil)
	_ sdk.Releaser   = (*delivery)(nil)
	_ sdk.AsyncAcker = (*delivery)(nil)
)

func (d *delivery) Message() *sdk.Message { return d.msg }
func (d *delivery) Attempt() int          { return d.attempt }
func (d *delivery) Queue() string         { return d.queue }

// JobID returns the row's id in the jobs table.
func (d *delivery) JobID() int64 { return d.id }

// settle runs one settlement: it refuses a second one, and marks the delivery
// settled when the row was written. A settlement that finds the lease lost
// leaves it unsettled: every later call reports the lost lease too.
func (d *delivery) settle(ctx context.Context, op string, f func(ctx context.Context) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled || d.acking {
		return fmt.Errorf("berth/postgres: %s job %d: %w", op, d.id, sdk.ErrAlreadySettled)
	}
	if d.b.isClosed() {
		return errClosed(op)
	}
	err := f(ctx)
	if err == nil {
		d.settled = true
	}
	return err
}

// Ack marks the job completed. Acks from concurrent deliveries are written
// together (see acker).
func (d *delivery) Ack(ctx context.Context) error {
	return d.settle(ctx, "ack", func(ctx context.Context) error { return d.b.acks.ack(ctx, d.id, d.token) })
}

// AckAsync is Ack without waiting ([sdk.AsyncAcker], what the Worker
// uses): the ack joins the next group-committed UPDATE and done receives
// what Ack would have returned — nil once the row is completed, an error
// wrapping [sdk.ErrLeaseLost] when another claim took the job meanwhile
// (the row is then left alone), or ctx's error if ctx ends first. While it
// is in flight, other settlements of d return [sdk.ErrAlreadySettled];
// ExtendLease still extends the lease (the Worker's heartbeat keeps it
// until the ack is written), so that an ack slow to be written does not let
// another claim take the job meanwhile.
func (d *delivery) AckAsync(ctx context.Context, done func(error)) {
	d.mu.Lock()
	switch {
	case d.settled || d.acking:
		d.mu.Unlock()
		done(fmt.Errorf("berth/postgres: ack job %d: %w", d.id, sdk.ErrAlreadySettled))
		return
	case d.b.isClosed():
		d.mu.Unlock()
		done(errClosed("ack"))
		return
	}
	d.acking = true
	d.mu.Unlock()
	d.b.acks.ackAsync(ctx, d.id, d.token, func(err error) {
		d.mu.Lock()
		d.acking = false
		if err == nil {
			d.settled = true
		}
		d.mu.Unlock()
		done(err)
	})
}

// Retry makes the job available again after delay, status 'retry', recording
// cause in last_error (as [sdk.SanitizeReason] makes it, without NUL bytes).
// The next claim counts a new attempt. The queue's receivers are notified
// whatever the delay, so that a Receive already waiting wakes at the new
// due time.
func (d *delivery) Retry(ctx context.Context, delay time.Duration, cause error) error {
	return d.settle(ctx, "retry", func(ctx context.Context) error {
		delay = clampDelay(delay)
		var lastErr *string
		if cause != nil {
			// Bounded and valid UTF-8, like the dead-letter reason: a cause
			// PostgreSQL text refuses would fail the Retry and waste the attempt.
			s := stripNUL(sdk.SanitizeReason(cause.Error()))
			lastErr = &s
		}
		return d.exec(ctx, "retry", true, `SET status = 'retry',
			available_at = now() + $3 * interval '1 microsecond', visibility_until = NULL,
			last_error = COALESCE($4, last_error), first_failure_at = COALESCE(first_failure_at, now()),
			updated_at = now()`, delay.Microseconds(), lastErr)
	})
}

// Release hands the job back without consuming an attempt: attempt_count is
// restored, so the next delivery has the same Attempt(). The queue's
// receivers are notified, as for Retry.
func (d *delivery) Release(ctx context.Context, delay time.Duration) error {
	return d.settle(ctx, "release", func(ctx context.Context) error {
		delay = clampDelay(delay)
		return d.exec(ctx, "release", true, `SET
			status = `+releasedStatus+`,
			attempt_count = greatest(attempt_count - 1, 0),
			available_at = now() + $3 * interval '1 microsecond', visibility_until = NULL, updated_at = now()`,
			delay.Microseconds())
	})
}

// releasedStatus is the status of a released row: 'queued' if it never
// failed, else 'retry' (as it was before the claim).
const releasedStatus = `CASE WHEN attempt_count <= 1 AND first_failure_at IS NULL THEN 'queued' ELSE 'retry' END`

// handBack releases, as Release does, the rows ids of queue that the claim
// made with token took for a Receive that cannot return them (its caller
// went, or the broker was closed meanwhile, or they could not be decoded).
// It runs on the claim's connection, not one taken from the pool: the
// application closes the pool after Close (the broker does not own it),
// and a closed pool gives no new connection, while the one held stays
// usable. It is one statement for all the rows, bounded by the claim
// limit, and it runs after Close too (Release would refuse), so that the
// rows are not left leased to nobody with an attempt spent; rows it cannot
// hand back come back after their lease. With notify, the queue's waiting
// Receive calls are woken.
func (b *Broker) handBack(ctx context.Context, conn *pgxpool.Conn, queue, token string, ids []int64, notify bool) {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.claimTimeout)
	defer cancel()
	batch := &pgx.Batch{}
	batch.Queue(`UPDATE `+b.table+` AS j SET
		status = `+releasedStatus+`,
		attempt_count = greatest(attempt_count - 1, 0),
		available_at = now(), visibility_until = NULL, updated_at = now()
		WHERE j.id = ANY($1::bigint[]) AND j.lease_token = $2::uuid AND j.status = 'processing'`, ids, token)
	if notify {
		batch.Queue(`SELECT pg_notify($1, $2)`, b.channel, queue)
	}
	if err := conn.SendBatch(hctx, batch).Close(); err != nil {
		b.opts.Logger.Warn("berth/postgres: jobs claimed for a Receive that cannot return them not handed back; they come back after their lease",
			"queue", queue, "jobs", len(ids), "err", err)
	}
}

// DeadLetter moves the job to status 'dead_letter' with last_error and the
// dead-letter headers of [sdk.AnnotateDeadLetter]. Their failure times are
// on the database server's clock, as every other time of the row: the last
// failure is the statement's now() (the row's updated_at), and a first
// failure not known before is first_failure_at, so that an application host
// whose clock is off does not stamp a last failure before the first, or
// one out of order with the dead-letter listing (ordered by updated_at).
// The headers are the delivered message's, as the handler left them: a NUL
// byte in a header's name or value (which Publish refuses, but a handler
// may set on the delivered message), which jsonb cannot hold, is written
// as U+FFFD, the rest of the headers unchanged (see storableHeaders), so
// that such a job can still be dead-lettered. The reason has its NUL bytes
// removed, as Retry's last_error.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	return d.settle(ctx, "dead-letter", func(ctx context.Context) error {
		m := d.msg.Clone()
		// A first failure is known when the row has one, or the message
		// carries one AnnotateDeadLetter keeps (an RFC 3339 time not
		// after now). A header it replaces (garbage, a time to come,
		// written by another tool) is no record: the server's clock gives
		// the first failure, as it gives the last.
		// A header AnnotateDeadLetter keeps is checked again in SQL
		// (headerFirst), against the server's clock: one after the
		// statement's now() (the last failure) is no record either, when
		// the application host's clock is ahead of the server's.
		now := d.b.now()
		knownFirst := !d.firstFailure.IsZero()
		var headerFirst *time.Time
		if h := m.Header(sdk.HeaderFirstFailure); !knownFirst && h != "" {
			t, err := time.Parse(time.RFC3339Nano, h)
			knownFirst = err == nil && !t.After(now)
			if knownFirst {
				// Rounded up to the microsecond, as the server keeps
				// times: not after now() means not after it at all.
				up := t.Truncate(time.Microsecond)
				if up.Before(t) {
					up = up.Add(time.Microsecond)
				}
				headerFirst = &up
			}
		}
		sdk.AnnotateDeadLetter(m, d.queue, d.attempt, cause, d.firstFailure, now)
		m.SetHeader(sdk.HeaderDeadLetterReason, stripNUL(m.Header(sdk.HeaderDeadLetterReason)))
		// A NUL in a header the handler set (Publish refuses one) would fail
		// the statement, and so every DeadLetter of the job, for ever.
		m.Headers = storableHeaders(m.Headers)
		headers, err := json.Marshal(m.Headers)
		if err != nil {
			return fmt.Errorf("berth/postgres: dead-letter job %d: %w", d.id, err)
		}
		return d.exec(ctx, "dead-letter", false, `SET status = 'dead_letter',
			headers = $3::jsonb || jsonb_build_object('`+sdk.HeaderLastFailure+`', `+fmt.Sprintf(rfc3339SQL, "now()")+`)
				|| CASE WHEN $5 AND COALESCE($6::timestamptz <= now(), true) THEN '{}'::jsonb ELSE jsonb_build_object('`+sdk.HeaderFirstFailure+`', `+
			fmt.Sprintf(rfc3339SQL, "COALESCE(first_failure_at, now())")+`) END,
			last_error = $4, visibility_until = NULL,
			first_failure_at = COALESCE(first_failure_at, now()), updated_at = now()`,
			string(headers), m.Header(sdk.HeaderDeadLetterReason), knownFirst, headerFirst)
	})
}

// ExtendLease pushes the lease to by from now, if this delivery still holds
// it. A by longer than [Broker.MaxLease] (12 h, or Options.Lease when
// longer) is clamped to it, as Retry and Release clamp their delay to
// [sdk.MaxDelay]: a job whose worker dies comes back within that time
// rather than being parked for centuries (math.MaxInt64 is 292 years).
// The Worker's heartbeat extends by its Lease, the broker's by default,
// which is never clamped. A by of zero or less is refused with an error
// wrapping [sdk.ErrInvalidMessage].
//
// It extends the lease of a delivery whose AckAsync is in flight too: the
// ack may wait for its batch (a lock, a slow disk) longer than the lease,
// and another claim must not take the job meanwhile. Once the ack is
// written it reports [sdk.ErrAlreadySettled].
func (d *delivery) ExtendLease(ctx context.Context, by time.Duration) error {
	if by <= 0 {
		return fmt.Errorf("berth/postgres: extend lease by %s: %w", by, sdk.ErrInvalidMessage)
	}
	by = min(by, d.b.MaxLease())
	d.mu.Lock()
	settled := d.settled
	d.mu.Unlock()
	if settled {
		return fmt.Errorf("berth/postgres: extend lease of job %d: %w", d.id, sdk.ErrAlreadySettled)
	}
	if d.b.isClosed() {
		return errClosed("extend lease")
	}
	// From clock_timestamp(), as the claim's lease: an UPDATE that waited
	// for the table longer than by would extend to a time already past.
	err := d.exec(ctx, "extend lease", false, `SET
		available_at = x.t + $3 * interval '1 microsecond',
		visibility_until = x.t + $3 * interval '1 microsecond', updated_at = now()
		FROM (SELECT clock_timestamp() AS t) AS x`, by.Microseconds())
	if errors.Is(err, sdk.ErrLeaseLost) {
		// A settlement of this delivery may have changed the row while the
		// UPDATE ran (it holds d.mu until it is written): then the lease was
		// not lost, the job is settled. Likewise while an AckAsync is in
		// flight: its ack may just have completed the row, and its outcome
		// (done) reports a lease lost meanwhile, as the settlement's.
		d.mu.Lock()
		settled := d.settled || d.acking
		d.mu.Unlock()
		if settled {
			return fmt.Errorf("berth/postgres: extend lease of job %d: %w", d.id, sdk.ErrAlreadySettled)
		}
	}
	return err
}

// exec runs "UPDATE jobs <set> WHERE id = $1 AND lease_token = $2 AND status =
// 'processing'": zero rows means another claim took the job (or it was
// purged), reported as [sdk.ErrLeaseLost]. With notify, the queue's waiters
// are woken in the same transaction.
func (d *delivery) exec(ctx context.Context, op string, notify bool, set string, args ...any) error {
	q := `UPDATE ` + d.b.table + ` ` + set + ` WHERE id = $1 AND lease_token = $2::uuid AND status = 'processing'`
	args = append([]any{d.id, d.token}, args...)
	var n int64
	if notify {
		batch := &pgx.Batch{}
		batch.Queue(q, args...)
		batch.Queue(`SELECT pg_notify($1, $2)`, d.b.channel, d.queue)
		br := d.b.pool.SendBatch(ctx, batch)
		tag, err := br.Exec()
		if err == nil {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return d.b.wrap(ctx, op, err)
		}
		n = tag.RowsAffected()
	} else {
		tag, err := d.b.pool.Exec(ctx, q, args...)
		if err != nil {
			return d.b.wrap(ctx, op, err)
		}
		n = tag.RowsAffected()
	}
	if n == 0 {
		return fmt.Errorf("berth/postgres: %s job %d: %w", op, d.id, sdk.ErrLeaseLost)
	}
	return nil
}

func clampDelay(d time.Duration) time.Duration {
	return min(max(d, 0), sdk.MaxDelay)
}

// parseHeaders decodes the headers column. Berth writes a JSON object of
// strings (exact is then true); a row written by hand may hold other JSON:
// a value that is not a string becomes its JSON text, and headers that are
// not an object are dropped (exact false), so that the job is still
// delivered, and can be dead-lettered, instead of failing whatever reads it.
func parseHeaders(raw []byte) (h map[string]string, exact bool) {
	if raw == nil {
		return nil, true
	}
	if json.Unmarshal(raw, &h) == nil {
		return h, true
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return nil, false
	}
	h = make(map[string]string, len(obj))
	for k, v := range obj {
		var s string
		if json.Unmarshal(v, &s) != nil {
			s = string(v)
		}
		h[k] = s
	}
	return h, false
}
