package outbox

import (
	"context"
	"fmt"
)

// ParkedIDs returns the ids of up to limit parked rows whose id is greater
// than after, in ascending order: a page of the parked rows, without their
// messages. Pass the last id of a page as after to read the next one; an
// empty page is the end. It reads only ids, so operator tools can count and
// walk any number of parked rows in bounded memory, and then [Outbox.Requeue]
// or [Outbox.Discard] exactly the rows they walked. limit must be positive.
func (o *Outbox) ParkedIDs(ctx context.Context, after int64, limit int) ([]int64, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("outbox: parked ids: limit %d, want > 0", limit)
	}
	rows, err := o.pool.Query(ctx, `SELECT id FROM `+o.table+` WHERE parked_at IS NOT NULL AND id > $1 ORDER BY id LIMIT $2`, after, limit)
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
