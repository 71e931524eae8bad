package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/berthq/berth/sdk"
)

// Queues returns the names of the queues that have jobs in the table (of
// any status, until retention deletes them), sorted.
func (b *Broker) Queues(ctx context.Context) ([]string, error) {
	if b.isClosed() {
		return nil, errClosed("queues")
	}
	rows, err := b.pool.Query(ctx, `SELECT DISTINCT queue FROM `+b.table+` ORDER BY queue`)
	if err != nil {
		return nil, b.wrap(ctx, "queues", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, b.wrap(ctx, "queues", err)
	}
	return names, nil
}

// DeadLetterPage returns up to limit (default [sdk.DefaultListLimit]) of
// queue's dead letters after cursor, the earliest dead-lettered first (as
// [Broker.ListDeadLetters] orders them), and the cursor of the next page (""
// when this page is the last). An empty cursor starts at the first. The
// cursor is a position, not a row: it stays valid while the dead letters it
// passed are redriven or deleted. The position is the dead-lettering time
// (updated_at, the start of the statement that dead-lettered the job, not
// its commit) and the row id, so a job dead-lettered after the walk started
// comes after the pages already read only if its dead-lettering statement
// started after the last of them was read. One that started earlier and
// committed later (it waited for a row lock, or its transaction was slow)
// may sort before the cursor: that walk misses it, and a new walk from the
// empty cursor finds it. Each page is one statement. Any updated_at
// PostgreSQL holds is a position: before 1970, and '-infinity' or
// 'infinity' (rows written by hand or by another tool), too.
func (b *Broker) DeadLetterPage(ctx context.Context, queue, cursor string, limit int) ([]*sdk.Message, string, error) {
	return b.deadLetterPage(ctx, queue, cursor, "", false, limit)
}

// DeadLetterMark returns a mark of the dead letters queue holds now, for
// [Broker.DeadLetterPageTo]: the position (as [Broker.DeadLetterPage]
// orders them) of the last one, "" when it holds none. The position is
// the database's: its clock wrote every updated_at.
func (b *Broker) DeadLetterMark(ctx context.Context, queue string) (string, error) {
	if b.isClosed() {
		return "", errClosed("dead letter mark")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return "", err
	}
	var (
		at pgtype.Timestamptz
		id int64
	)
	err := b.pool.QueryRow(ctx, `SELECT updated_at, id FROM `+b.table+`
		WHERE queue = $1 AND status = 'dead_letter' ORDER BY updated_at DESC, id DESC LIMIT 1`, queue).Scan(&at, &id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", nil
	case err != nil:
		return "", b.wrap(ctx, "dead letter mark", err)
	}
	return pagePosition(at, id), nil
}

// DeadLetterPageTo is [Broker.DeadLetterPage] restricted to the dead
// letters at or before mark (from [Broker.DeadLetterMark]); the mark ""
// returns none. A job dead-lettered again after it was redriven gets a
// later position (updated_at is the start of the statement that
// dead-lettered it, which came after the redrive and so after the mark), so
// a walk to the mark does not see it twice, unless the database's clock
// went back meanwhile. The cursor of the next page is "" after the last
// page that reaches the mark.
func (b *Broker) DeadLetterPageTo(ctx context.Context, queue, cursor, mark string, limit int) ([]*sdk.Message, string, error) {
	if mark == "" {
		if b.isClosed() {
			return nil, "", errClosed("dead letter page")
		}
		if err := sdk.ValidateQueueName(queue); err != nil {
			return nil, "", err
		}
		return nil, "", nil
	}
	return b.deadLetterPage(ctx, queue, cursor, mark, true, limit)
}

// pagePosition is the cursor (or mark) of the dead letter at (at, id):
// at's microseconds since the Unix epoch (negative before 1970), or
// "infinity" or "-infinity" for a row written with one (by hand or by
// another tool), a dash, and id.
func pagePosition(at pgtype.Timestamptz, id int64) string {
	var t string
	switch at.InfinityModifier {
	case pgtype.Infinity:
		t = "infinity"
	case pgtype.NegativeInfinity:
		t = "-infinity"
	default:
		t = strconv.FormatInt(at.Time.UnixMicro(), 10)
	}
	return t + "-" + strconv.FormatInt(id, 10)
}

// parsePosition parses a cursor or mark of pagePosition. The time and the id
// are split at the first dash after the first character, which is the time's
// sign when it is negative.
func parsePosition(s, what string) (pgtype.Timestamptz, int64, error) {
	bad := errors.New("berth/postgres: invalid dead-letter page " + what)
	i := -1
	if len(s) > 1 {
		i = strings.IndexByte(s[1:], '-')
	}
	if i < 0 {
		return pgtype.Timestamptz{}, 0, bad
	}
	us, id := s[:i+1], s[i+2:]
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		return pgtype.Timestamptz{}, 0, bad
	}
	switch us {
	case "infinity":
		return pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}, n, nil
	case "-infinity":
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, n, nil
	}
	u, err := strconv.ParseInt(us, 10, 64)
	if err != nil {
		return pgtype.Timestamptz{}, 0, bad
	}
	return pgtype.Timestamptz{Time: time.UnixMicro(u), Valid: true}, n, nil
}

// deadLetterPage is DeadLetterPage, restricted to the dead letters at or
// before mark when toMark.
func (b *Broker) deadLetterPage(ctx context.Context, queue, cursor, mark string, toMark bool, limit int) ([]*sdk.Message, string, error) {
	if b.isClosed() {
		return nil, "", errClosed("dead letter page")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, "", err
	}
	if limit <= 0 {
		limit = sdk.DefaultListLimit
	}
	// One more than asked tells whether another page follows: a limit of
	// "everything" (math.MaxInt) must not wrap round to a negative LIMIT.
	limit = min(limit, math.MaxInt32)
	after, afterID := pgtype.Timestamptz{}, int64(0)
	if cursor != "" {
		var err error
		if after, afterID, err = parsePosition(cursor, "cursor"); err != nil {
			return nil, "", err
		}
	}
	upTo, upToID := pgtype.Timestamptz{}, int64(0)
	if toMark {
		var err error
		if upTo, upToID, err = parsePosition(mark, "mark"); err != nil {
			return nil, "", err
		}
	}
	args := []any{queue, limit + 1}
	if cursor != "" {
		args = append(args, after, afterID)
	}
	if toMark {
		args = append(args, upTo, upToID)
	}
	rows, err := b.pool.Query(ctx, b.deadLetterPageSQL(cursor != "", toMark), args...)
	if err != nil {
		return nil, "", b.wrap(ctx, "dead letter page", err)
	}
	var (
		msgs []*sdk.Message
		last string
		next string
	)
	_, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{}, error) {
		if len(msgs) == limit {
			next = last
			return struct{}{}, nil
		}
		m := &sdk.Message{}
		var (
			headers []byte
			at      pgtype.Timestamptz
			id      int64
		)
		if err := r.Scan(&m.ID, &m.Type, &m.Body, &headers, &m.CorrelationID, &m.Key, &m.IdempotencyKey, &at, &id); err != nil {
			return struct{}{}, err
		}
		decodeHeaders(m, headers)
		msgs = append(msgs, m)
		last = pagePosition(at, id)
		return struct{}{}, nil
	})
	if err != nil {
		return nil, "", b.wrap(ctx, "dead letter page", err)
	}
	return msgs, next, nil
}

// deadLetterPageSQL is the statement of a dead-letter page: $1 the queue,
// $2 the limit, then, with cursor, the cursor's position (time and id),
// then, with mark, the mark's. It reads jobs_dead_letter_page_idx in
// order, from the cursor on, and stops at the limit: a page costs its own
// rows, not a sort of all the queue's dead letters, nor a scan of those
// before the cursor. Each shape is its own statement, not one with
// "$2 IS NULL OR (updated_at, id) > ...": the generic plan PostgreSQL
// moves a prepared statement to after five runs cannot bound the index
// scan by such a condition, and would read (and filter out) every dead
// letter before the cursor on every page.
func (b *Broker) deadLetterPageSQL(cursor, mark bool) string {
	q := `SELECT ` + deadLetterColumns + `, updated_at, id FROM ` + b.table + `
		WHERE queue = $1 AND status = 'dead_letter'`
	n := 2
	if cursor {
		q += fmt.Sprintf(` AND (updated_at, id) > ($%d::timestamptz, $%d::bigint)`, n+1, n+2)
		n += 2
	}
	if mark {
		q += fmt.Sprintf(` AND (updated_at, id) <= ($%d::timestamptz, $%d::bigint)`, n+1, n+2)
	}
	return q + ` ORDER BY updated_at, id LIMIT $2`
}

// DeleteDeadLetters deletes the dead letters of queue whose message IDs are
// ids and returns how many. If any id is not a dead letter of queue, nothing
// is deleted and the error wraps [sdk.ErrNotFound]. With no ids it deletes
// nothing ([Broker.PurgeDeadLetters] deletes them all).
func (b *Broker) DeleteDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	if b.isClosed() {
		return 0, errClosed("delete dead letters")
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if id, bad := unstorableID(ids...); bad {
		return 0, fmt.Errorf("berth/postgres: delete dead letter %s of %s: %w", sdk.ErrorText(id), queue, sdk.ErrNotFound)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return 0, b.wrap(ctx, "delete dead letters", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// Joined with the IDs rather than "= ANY($2)", as RedriveDeadLetters is.
	rows, err := tx.Query(ctx, `DELETE FROM `+b.table+` USING unnest($2::text[]) AS chosen(id)
		WHERE queue = $1 AND status = 'dead_letter' AND message_id = chosen.id RETURNING message_id`, queue, ids)
	if err != nil {
		return 0, b.wrap(ctx, "delete dead letters", err)
	}
	deleted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, b.wrap(ctx, "delete dead letters", err)
	}
	found := make(map[string]bool, len(deleted))
	for _, id := range deleted {
		found[id] = true
	}
	for _, id := range ids {
		if !found[id] {
			return 0, fmt.Errorf("berth/postgres: delete dead letter %s of %s: %w", sdk.ErrorText(id), queue, sdk.ErrNotFound)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, b.wrap(ctx, "delete dead letters", err)
	}
	return len(deleted), nil
}

// decodeHeaders fills m.Headers from the headers column and makes a NULL
// body empty, as scanMessage does.
func decodeHeaders(m *sdk.Message, headers []byte) {
	m.Headers, _ = parseHeaders(headers)
	if m.Body == nil {
		m.Body = []byte{}
	}
}
