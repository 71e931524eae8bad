package idempotency

import (
	"context"
	"fmt"
	"time"
)

// DefaultPurgeBatch is the batch size [PurgeExpired] uses when given none.
const DefaultPurgeBatch = 1000

// PurgeExpired deletes the rows whose retention passed, batch rows at a time
// (default 1000), until a batch comes back short or ctx is done. Each batch is
// its own short statement, so a large backlog never holds long locks. It
// returns how many rows it deleted.
func PurgeExpired(ctx context.Context, s Store, batch int) (int, error) {
	if batch <= 0 {
		batch = DefaultPurgeBatch
	}
	total := 0
	for {
		n, err := s.DeleteExpired(ctx, batch)
		total += n
		if err != nil {
			return total, fmt.Errorf("idempotency: purge expired: %w", err)
		}
		if n < batch {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// RunJanitor calls [PurgeExpired] every interval (default 1m) until ctx is
// done, then returns ctx's error. Failures are retried at the next tick;
// report, optional, sees each run's count and error.
func RunJanitor(ctx context.Context, s Store, interval time.Duration, batch int, report func(deleted int, err error)) error {
	if interval <= 0 {
		interval = time.Minute
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n, err := PurgeExpired(ctx, s, batch)
		if report != nil && ctx.Err() == nil {
			report(n, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
