package postgres

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthq/berth/internal/pgretry"
	"github.com/berthq/berth/sdk"
)

// maxAckBatch bounds the rows of one completion statement.
const maxAckBatch = 500

// acker completes acked jobs in batches (group commit): Ack appends its row
// to the pending list, kicks the acker's goroutine and waits; the goroutine
// takes everything pending at that moment and completes it in one UPDATE. A
// lone ack is written at once; under load, acks that arrive while a statement
// runs share the next one. Ack still returns only once its row is durably
// completed (or not).
type acker struct {
	b    *Broker
	kick chan struct{} // buffered (1): "something is pending"

	mu      sync.Mutex
	pending []ackReq
	stopped bool // run has returned: Ack reports ErrClosed

	flushes, rows atomic.Int64 // statements and rows written, for the benchmark
	unbatched     atomic.Bool  // write each ack alone (the benchmark's baseline)
}

type ackReq struct {
	id    int64
	token string
	done  chan error // buffered (1): a flush never blocks on a caller that gave up
}

func newAcker(b *Broker) *acker { return &acker{b: b, kick: make(chan struct{}, 1)} }

// ack completes the row if its lease token still matches.
func (a *acker) ack(ctx context.Context, id int64, token string) error {
	r := ackReq{id: id, token: token, done: make(chan error, 1)}
	if a.unbatched.Load() {
		a.flush([]ackReq{r})
		return <-r.done
	}
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		return errClosed("ack")
	}
	a.pending = append(a.pending, r)
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default: // already kicked
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// take removes up to maxAckBatch pending acks.
func (a *acker) take() []ackReq {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := min(len(a.pending), maxAckBatch)
	batch := a.pending[:n:n]
	a.pending = a.pending[n:]
	if len(a.pending) == 0 {
		a.pending = nil
	}
	return batch
}

// run is the acker's goroutine; it returns when ctx is cancelled (Close),
// after writing every ack already pending.
func (a *acker) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			a.mu.Lock()
			a.stopped = true
			a.mu.Unlock()
			for batch := a.take(); len(batch) > 0; batch = a.take() {
				a.flush(batch)
			}
			return
		case <-a.kick:
		}
		for batch := a.take(); len(batch) > 0; batch = a.take() {
			a.flush(batch)
		}
	}
}

// flush completes batch in one statement. It does not use the callers'
// contexts (one caller giving up must not fail the others); it is bounded by
// its own timeout instead.
func (a *acker) flush(batch []ackReq) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a.flushes.Add(1)
	a.rows.Add(int64(len(batch)))
	// Feed the rows in id order, so that two batches sharing rows (a stale
	// worker's ack and the new holder's) lock them in the same order and do
	// not deadlock in the usual plan; if they ever do, the error wraps
	// sdk.ErrUnavailable and the job comes back after its lease.
	slices.SortFunc(batch, func(x, y ackReq) int { return cmp.Compare(x.id, y.id) })
	ids := make([]int64, len(batch))
	tokens := make([]string, len(batch))
	for i, r := range batch {
		ids[i], tokens[i] = r.id, r.token
	}
	// The statement is idempotent: it matches the row by its lease token
	// whether it is still processing or already completed by this very
	// statement (a completed row keeps its token, and no other delivery
	// holds it). So when it fails on a lost connection, whose outcome is
	// unknown, it is run again (pgretry), instead of failing the whole
	// batch and leaving its jobs to wait out their lease.
	done := make(map[int64]bool, len(batch))
	err := pgretry.Do(ctx, func(ctx context.Context) error {
		clear(done)
		rows, err := a.b.pool.Query(ctx, `UPDATE `+a.b.table+` AS j
		SET status = 'completed', visibility_until = NULL, updated_at = now()
		FROM unnest($1::bigint[], $2::text[]::uuid[]) AS a(id, token)
		WHERE j.id = a.id AND j.lease_token = a.token AND j.status IN ('processing', 'completed')
		RETURNING j.id`, ids, tokens)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id int64
			if err = rows.Scan(&id); err != nil {
				break
			}
			done[id] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		return err
	})
	if err != nil {
		err = a.b.wrap("ack", err)
		for _, r := range batch {
			r.done <- err
		}
		return
	}
	for _, r := range batch {
		if done[r.id] {
			r.done <- nil
		} else {
			r.done <- fmt.Errorf("berth/postgres: ack job %d: %w", r.id, sdk.ErrLeaseLost)
		}
	}
}
