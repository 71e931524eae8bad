package postgres

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/berthq/berth/internal/pgretry"
	"github.com/berthq/berth/sdk"
)

// maxAckBatch bounds the rows of one completion statement.
const maxAckBatch = 500

// acker completes acked jobs in batches (group commit): an ack appends its
// row to the pending list and kicks the acker's goroutine; the goroutine
// takes everything pending at that moment and completes it in one UPDATE
// (one commit). A lone ack is written at once; under load, acks that arrive
// while a statement runs share the next one, so the batch grows with the
// load and no linger is needed. Ack waits for its row's outcome; AckAsync
// (what the Worker uses) is told it by a callback, so the handler that
// finished the job goes on with the next one meanwhile. Either way the
// outcome is per row: completed, or the lease was lost.
type acker struct {
	b    *Broker
	kick chan struct{} // buffered (1): "something is pending"

	mu      sync.Mutex
	pending []*ackReq
	stopped bool // run has returned: acks report ErrClosed

	hold sync.Mutex // held by tests (HoldAcks) to keep a batch from being written

	flushes, rows atomic.Int64 // statements and rows written, for the benchmark
	unbatched     atomic.Bool  // write each ack alone (the benchmark's baseline)
}

// ackReq is one pending ack; finish reports its outcome once.
type ackReq struct {
	id    int64
	token string
	done  func(error)
	once  atomic.Bool
	stop  func() bool // unregisters the caller's context watch, if any
}

// finish calls done with err, the first time only, and unregisters the
// caller's context watch.
func (r *ackReq) finish(err error) {
	if !r.once.CompareAndSwap(false, true) {
		return
	}
	if r.stop != nil {
		r.stop()
	}
	r.done(err)
}

// cut is finish for the caller's context watch itself: it does not read
// stop, which ackAsync may still be assigning when a context already done
// runs the watch at once (the watch has run: there is nothing to
// unregister).
func (r *ackReq) cut(err error) {
	if r.once.CompareAndSwap(false, true) {
		r.done(err)
	}
}

func newAcker(b *Broker) *acker { return &acker{b: b, kick: make(chan struct{}, 1)} }

// ack completes the row if its lease token still matches, and waits.
func (a *acker) ack(ctx context.Context, id int64, token string) error {
	ch := make(chan error, 1) // a flush never blocks on a caller that gave up
	a.ackAsync(context.Background(), id, token, func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ackAsync queues the row for the next batch; done receives its outcome,
// or ctx's error if ctx ends first (the row may still be completed then, as
// when a synchronous Ack gives up).
func (a *acker) ackAsync(ctx context.Context, id int64, token string, done func(error)) {
	r := &ackReq{id: id, token: token, done: done}
	if a.unbatched.Load() {
		a.flush([]*ackReq{r})
		return
	}
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		r.finish(errClosed("ack"))
		return
	}
	if ctx.Done() != nil {
		r.stop = context.AfterFunc(ctx, func() { r.cut(ctx.Err()) })
	}
	a.pending = append(a.pending, r)
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default: // already kicked
	}
}

// take removes up to maxAckBatch pending acks.
func (a *acker) take() []*ackReq {
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

// pendingCount is how many acks wait for a statement (for tests).
func (a *acker) pendingCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pending)
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
			a.flushAll()
			return
		case <-a.kick:
		}
		a.flushAll()
	}
}

// flushAll writes what is pending, batch after batch.
func (a *acker) flushAll() {
	a.hold.Lock()
	defer a.hold.Unlock()
	for batch := a.take(); len(batch) > 0; batch = a.take() {
		a.flush(batch)
	}
}

// flush completes batch in one statement. It does not use the callers'
// contexts (one caller giving up must not fail the others); it is bounded by
// its own timeout instead.
func (a *acker) flush(batch []*ackReq) {
	ctx, cancel := context.WithTimeout(context.Background(), a.b.ackTimeout)
	defer cancel()
	a.flushes.Add(1)
	a.rows.Add(int64(len(batch)))
	// Feed the rows in id order, so that two batches sharing rows (a stale
	// worker's ack and the new holder's) lock them in the same order and do
	// not deadlock in the usual plan; if they ever do, the error wraps
	// sdk.ErrUnavailable and the job comes back after its lease.
	slices.SortFunc(batch, func(x, y *ackReq) int { return cmp.Compare(x.id, y.id) })
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
	// Completed rows are known by id and token: a batch may hold a stale
	// delivery's ack and the new holder's for the same row, and only the
	// holder's is done.
	type key struct {
		id    int64
		token string
	}
	done := make(map[key]bool, len(batch))
	err := pgretry.Do(ctx, func(ctx context.Context) error {
		clear(done)
		rows, err := a.b.pool.Query(ctx, `UPDATE `+a.b.table+` AS j
		SET status = 'completed', visibility_until = NULL, updated_at = now()
		FROM unnest($1::bigint[], $2::text[]::uuid[]) AS a(id, token)
		WHERE j.id = a.id AND j.lease_token = a.token AND j.status IN ('processing', 'completed')
		RETURNING j.id, j.lease_token::text`, ids, tokens)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k key
			if err = rows.Scan(&k.id, &k.token); err != nil {
				break
			}
			done[k] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		return err
	})
	if err != nil {
		err = a.b.wrap(context.Background(), "ack", err) // no caller: a context error is the flush's own limit
		for _, r := range batch {
			r.finish(err)
		}
		return
	}
	for _, r := range batch {
		if done[key{r.id, r.token}] {
			r.finish(nil)
		} else {
			r.finish(fmt.Errorf("berth/postgres: ack job %d: %w", r.id, sdk.ErrLeaseLost))
		}
	}
}
