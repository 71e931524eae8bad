package outbox

import (
	"context"
	"fmt"
	"time"
)

// ParkedIDs returns the ids of up to limit parked rows whose id is greater
// than after, in ascending order: a page of the parked rows, without their
// messages. Pass the last id of a page as after to read the next one; an
// empty page is the end. It reads only ids, so operator tools can count and
// walk any number of parked rows in bounded memory, and then [Outbox.Requeue]
// or [Outbox.Discard] exactly the rows they walked. limit must be positive.
func (o *Outbox) ParkedIDs(ctx context.Context, after int64, limit int) ([]int64, error) {
	return o.parkedIDs(ctx, after, limit, nil)
}

// ParkedIDsUntil is [Outbox.ParkedIDs] of the rows parked at or before
// until, by the database's clock (parked_at; a row whose parked_at is
// ±infinity, written by hand, is included). An operator tool that counted
// the parked rows, had the count confirmed and then changes them takes until
// from the database after the count, and pages with it: the rows parked
// since are left alone whatever their id. An id ceiling cannot tell them
// apart: a row is parked long after it was added (after its MaxAttempts), so
// a row parked after the count usually has a lower id than rows counted.
func (o *Outbox) ParkedIDsUntil(ctx context.Context, after int64, limit int, until time.Time) ([]int64, error) {
	return o.parkedIDs(ctx, after, limit, &until)
}

func (o *Outbox) parkedIDs(ctx context.Context, after int64, limit int, until *time.Time) ([]int64, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("outbox: parked ids: limit %d, want > 0", limit)
	}
	rows, err := o.pool.Query(ctx, `SELECT id FROM `+o.table+` WHERE parked_at IS NOT NULL AND id > $1
AND ($3::timestamptz IS NULL OR parked_at <= $3 OR NOT isfinite(parked_at)) ORDER BY id LIMIT $2`, after, limit, until)
	if err != nil {
		return nil, fmt.Errorf("outbox: parked ids: %w", err)
	}
	defer rows.Close()
	ids := make([]int64, 0, min(limit, 1024))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("outbox: parked ids: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: parked ids: %w", err)
	}
	return ids, nil
}
