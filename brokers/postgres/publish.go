package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/sdk"
)

// Publish inserts one job per message into queue, in one statement, and
// notifies the queue's receivers (delayed messages too, so that a waiting
// Receive recomputes its sleep). It returns once the rows are committed. A
// message is due Delay after the statement starts, on the database
// server's clock.
// Messages are validated by [sdk.PrepareAll] first (nothing is inserted when
// one fails); values PostgreSQL text cannot hold (NUL bytes) are refused with
// [sdk.ErrInvalidHeader] or [sdk.ErrInvalidMessage], as is an ID or
// IdempotencyKey over [MaxIndexedLength] bytes. With
// Options.DedupeEnqueue, a message whose IdempotencyKey a job of queue
// already has is not inserted, and its ID is set to the existing job's.
// Within a batch the messages are inserted in order, so the first message
// with a key wins and a later one with the same key is such a duplicate,
// as across batches; this holds when messages share an ID too (each
// message's outcome is its own, not its ID's).
//
// A batch is all or nothing (one statement). After Close it returns
// [sdk.ErrClosed].
func (b *Broker) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	if b.isClosed() {
		return errClosed("publish")
	}
	if err := b.prepare(ctx, queue, msgs); err != nil || len(msgs) == 0 {
		return err
	}
	return b.insert(ctx, b.pool, queue, msgs)
}

// PublishTx inserts the jobs inside the caller's transaction: they exist if
// and only if tx commits, and receivers are notified at commit (NOTIFY is
// transactional). Use it to enqueue work in the same transaction as the
// business change that calls for it. tx is not committed or rolled back
// here. A message's Delay counts from this call's statement, not from the
// start of tx (statement_timestamp(), the server's clock): a job published
// with Delay d late in a long transaction is due d after the PublishTx
// statement (and, being invisible until then, never claimed before tx
// commits). Otherwise it behaves as [Broker.Publish].
func (b *Broker) PublishTx(ctx context.Context, tx pgx.Tx, queue string, msgs ...*sdk.Message) error {
	if b.isClosed() {
		return errClosed("publish")
	}
	if tx == nil {
		return fmt.Errorf("berth/postgres: publish: nil transaction: %w", sdk.ErrInvalidMessage)
	}
	if err := b.prepare(ctx, queue, msgs); err != nil || len(msgs) == 0 {
		return err
	}
	return b.insert(ctx, tx, queue, msgs)
}

var _ sdk.TxPublisher[pgx.Tx] = (*Broker)(nil)

// prepare validates msgs for this broker.
func (b *Broker) prepare(ctx context.Context, queue string, msgs []*sdk.Message) error {
	if err := sdk.PrepareAll(ctx, queue, msgs, b.opts.MaxMessageSize); err != nil {
		return err
	}
	for _, m := range msgs {
		for k, v := range m.Headers {
			if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
				return &sdk.HeaderError{Name: stripNUL(k), Reason: "PostgreSQL cannot store NUL bytes in headers"}
			}
		}
		for _, s := range []string{m.ID, m.Type, m.IdempotencyKey, m.Key, m.CorrelationID} {
			if strings.IndexByte(s, 0) >= 0 {
				return fmt.Errorf("%w: message %s: PostgreSQL cannot store NUL bytes in ID, Type, IdempotencyKey, Key or CorrelationID",
					sdk.ErrInvalidMessage, sdk.ErrorText(m.ID))
			}
		}
		if len(m.ID) > MaxIndexedLength || len(m.IdempotencyKey) > MaxIndexedLength {
			return fmt.Errorf("%w: message %s…: its ID (%d bytes) or IdempotencyKey (%d bytes) is over the %d an index of the jobs table holds",
				sdk.ErrInvalidMessage, sdk.ErrorText(fmt.Sprintf("%.64s", m.ID)), len(m.ID), len(m.IdempotencyKey), MaxIndexedLength)
		}
	}
	return nil
}

// MaxIndexedLength bounds, in bytes, a message's ID and IdempotencyKey on
// this broker: the jobs table indexes them beside the queue name (80 bytes
// at most) — the dead letters by (queue, message_id), the enqueue dedupe
// by (queue, idempotency_key) — and PostgreSQL refuses a btree index row
// over 2704 bytes (SQLSTATE 54000). Publish refuses a longer one with
// [sdk.ErrInvalidMessage]: accepted, a longer ID made the job's
// dead-lettering fail for ever (and the claim that dead-letters it at the
// attempt cap, with it every claim of the queue), and a longer key with
// DedupeEnqueue failed the whole batch with a raw database error.
const MaxIndexedLength = 2048

// querier is what insert needs from a pool or a transaction.
type querier interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// insert writes msgs, already prepared, with q.
func (b *Broker) insert(ctx context.Context, q querier, queue string, msgs []*sdk.Message) error {
	n := len(msgs)
	var (
		ids, types, corrs, keys, idems = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		bodies                         = make([][]byte, n)
		payloadJSON, headers           = make([]*string, n), make([]*string, n)
		delays                         = make([]int64, n)
	)
	for i, m := range msgs {
		ids[i], types[i], corrs[i], keys[i], idems[i] = m.ID, m.Type, m.CorrelationID, m.Key, m.IdempotencyKey
		bodies[i] = m.Body
		if bodies[i] == nil {
			bodies[i] = []byte{}
		}
		if jsonCopyable(m.Body) {
			s := string(m.Body)
			payloadJSON[i] = &s
		}
		if m.Headers != nil {
			h, err := json.Marshal(m.Headers)
			if err != nil {
				return fmt.Errorf("berth/postgres: publish: headers of %s: %w", sdk.ErrorText(m.ID), err)
			}
			s := string(h)
			headers[i] = &s
		}
		delays[i] = m.Delay.Microseconds()
	}
	// Without DedupeEnqueue every row has dedupe = false, outside the
	// partial unique index, so no row can conflict: the plain INSERT spares
	// each row the speculative insertion of ON CONFLICT (and its extra WAL
	// record), and there is nothing to return.
	dedupe := b.opts.DedupeEnqueue
	conflict := ""
	if dedupe {
		// In the batch's order, so that the first message with a key wins.
		conflict = `
		ORDER BY u.ord
		ON CONFLICT (queue, idempotency_key) WHERE dedupe DO NOTHING
		RETURNING message_id, coalesce(idempotency_key, '')`
	}
	batch := &pgx.Batch{}
	batch.Queue(`INSERT INTO `+b.table+` (queue, message_id, job_type, payload, payload_json, headers,
			correlation_id, ordering_key, idempotency_key, dedupe, max_attempts, available_at)
		SELECT $1, u.message_id, u.job_type, u.payload, u.payload_json::json, u.headers::jsonb,
			u.correlation_id, u.ordering_key, NULLIF(u.idem, ''), $2 AND u.idem <> '', $3,
			statement_timestamp() + u.delay_us * interval '1 microsecond'
		FROM unnest($4::text[], $5::text[], $6::bytea[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::bigint[])
			WITH ORDINALITY AS u(message_id, job_type, payload, payload_json, headers, correlation_id, ordering_key, idem, delay_us, ord)`+conflict,
		queue, dedupe, b.opts.MaxAttempts,
		ids, types, bodies, payloadJSON, headers, corrs, keys, idems, delays)
	// One notification per statement, delayed messages included: a
	// Receive already asleep wakes and recomputes its sleep from the
	// earliest due time, instead of sleeping until its old deadline.
	batch.Queue(`SELECT pg_notify($1, $2)`, b.channel, queue)
	br := q.SendBatch(ctx, batch)
	// returned counts the inserted rows by message ID and idempotency key
	// ("" for none): messages may share an ID, so that alone cannot say
	// which of them were inserted.
	var returned map[[2]string]int
	var err error
	if dedupe {
		returned = make(map[[2]string]int, n)
		var rows pgx.Rows
		rows, err = br.Query()
		if err == nil {
			for rows.Next() {
				var idKey [2]string
				if err = rows.Scan(&idKey[0], &idKey[1]); err != nil {
					break
				}
				returned[idKey]++
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
	} else {
		_, err = br.Exec()
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return b.wrap(ctx, "publish", err)
	}
	if !dedupe {
		return nil
	}
	// Rows were inserted in the batch's order, and of messages with the
	// same ID and key only the first can have been (the others conflict
	// with it): the first ones take the returned rows.
	inserted := make([]bool, n)
	all := true
	for i, m := range msgs {
		idKey := [2]string{m.ID, m.IdempotencyKey}
		if returned[idKey] > 0 {
			returned[idKey]--
			inserted[i] = true
		} else {
			all = false
		}
	}
	if all {
		return nil
	}
	return b.resolveDuplicates(ctx, q, queue, msgs, inserted)
}

// jsonCopyable reports whether body may be copied into payload_json: it is
// valid JSON (json.Valid accepts invalid UTF-8 inside strings, which
// PostgreSQL text refuses with SQLSTATE 22021, so UTF-8 is checked too), and
// has no \u0000 or surrogate escape, which PostgreSQL's json stores but
// refuses to turn into text or jsonb (a query of payload_json would fail).
// The test for escapes is conservative: an escaped backslash followed by
// "u0000" also leaves payload_json NULL. The body itself is always stored
// byte for byte in payload.
func jsonCopyable(body []byte) bool {
	if !utf8.Valid(body) || !json.Valid(body) {
		return false
	}
	for i := 0; ; {
		j := bytes.Index(body[i:], []byte(`\u`))
		if j < 0 {
			return true
		}
		i += j + 2
		if len(body)-i >= 4 {
			hex := strings.ToLower(string(body[i : i+4]))
			if hex == "0000" || hex[0] == 'd' && hex[1] >= '8' {
				return false
			}
		}
	}
}

// resolveDuplicates sets the ID of each message that dedupe did not insert to
// the ID of the job holding its idempotency key; inserted[i] says whether
// msgs[i] was inserted.
func (b *Broker) resolveDuplicates(ctx context.Context, q querier, queue string, msgs []*sdk.Message, inserted []bool) error {
	var keys []string
	for i, m := range msgs {
		if !inserted[i] && m.IdempotencyKey != "" {
			keys = append(keys, m.IdempotencyKey)
		}
	}
	rows, err := q.Query(ctx, `SELECT idempotency_key, message_id FROM `+b.table+`
		WHERE queue = $1 AND dedupe AND idempotency_key = ANY($2)`, queue, keys)
	if err != nil {
		return b.wrap(ctx, "publish", err)
	}
	existing, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var kv [2]string
		err := r.Scan(&kv[0], &kv[1])
		return kv, err
	})
	if err != nil {
		return b.wrap(ctx, "publish", err)
	}
	byKey := make(map[string]string, len(existing))
	for _, kv := range existing {
		byKey[kv[0]] = kv[1]
	}
	for i, m := range msgs {
		if inserted[i] || m.IdempotencyKey == "" {
			continue
		}
		if id, ok := byKey[m.IdempotencyKey]; ok {
			m.ID = id
		}
	}
	return nil
}
