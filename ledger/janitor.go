package ledger

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/berthq/berth/sdk"
)

// Purger deletes finished jobs (succeeded or dead) last updated before
// before, batch rows per statement, and returns how many it deleted.
// pgledger.Store implements it.
type Purger interface {
	Purge(ctx context.Context, before time.Time, batch int) (int, error)
}

// StalePurger is a [Purger] that also deletes the jobs that never
// finished: rows neither succeeded nor dead, last updated before before,
// whose next attempt (if any: a retry's, a release's, a delayed publish's)
// was due before it too, batch rows per statement, until a batch comes
// back short or ctx is done. It returns how many it deleted.
// pgledger.Store implements it.
type StalePurger interface {
	Purger
	PurgeStale(ctx context.Context, before time.Time, batch int) (int, error)
}

// Defaults of [JanitorOptions].
const (
	DefaultRetention       = 7 * 24 * time.Hour
	DefaultJanitorInterval = time.Minute
	// DefaultStaleRetentionFactor times Retention is the default
	// StaleRetention: 28 days with the default Retention.
	DefaultStaleRetentionFactor = 4
)

// JanitorOptions configures [RunJanitor]. Purger or DeadLetterQueues (or
// both) must be set.
type JanitorOptions struct {
	// Purger, when set, is purged of the jobs that finished more than
	// Retention ago at every tick.
	Purger Purger
	// Retention is how long finished jobs are kept. Default 7 days.
	Retention time.Duration
	// StaleRetention is how long a job that never finished (enqueued,
	// running, retrying, released or redriven) is kept after its last
	// update, or after its next attempt is due when that is later (a
	// retry's or release's delay; a delayed publish recorded by
	// [Ledger.Publisher], up to an sdk.LongDelay's due time). Such a row
	// gets no terminal state when its message leaves the broker outside
	// berth (a queue purge, a broker's TTL or max length, a dead-letter
	// nobody syncs), and without this it would stay forever. Default
	// DefaultStaleRetentionFactor × Retention; negative keeps them
	// forever; a positive value must be at least Retention. A job still
	// alive past it without an event (a message backlogged longer, a
	// handler running longer) loses its row's earlier states: its next
	// event starts the row again. It needs a Purger that is a [StalePurger]
	// (pgledger.Store is): a positive value with another Purger is
	// refused, the default then does nothing.
	StaleRetention time.Duration
	// Batch bounds the rows one purge statement deletes (0: the
	// purger's default).
	Batch int
	// Interval between runs. Default 1 minute.
	Interval time.Duration
	// Ledger, DeadLetters and DeadLetterQueues, when set, make each run
	// call Ledger.SyncDeadLetters for every queue, listing at most
	// DeadLetterLimit letters each (0: [sdk.DefaultListLimit]). Where
	// DeadLetters pages with a cursor (a DeadLetterPage method: the
	// memory, PostgreSQL and JetStream brokers), each run reads the page
	// after the one the last run read, starting over after the last, so
	// that letters past the first DeadLetterLimit are synced too; other
	// brokers list the oldest DeadLetterLimit at every run. With a
	// Purger, a letter that died before the retention cutoff only ends
	// an attempt its row still shows open: a job the purge deleted is not
	// made again from its letter at every run.
	Ledger           *Ledger
	DeadLetters      sdk.DeadLetters
	DeadLetterQueues []string
	DeadLetterLimit  int
	// Report, optional, sees each run's outcome (not a run cut short by
	// the context ending).
	Report func(JanitorRun)
}

// JanitorRun is the outcome of one janitor run.
type JanitorRun struct {
	Purged int   // finished jobs deleted
	Stale  int   // jobs that never finished deleted (StaleRetention)
	Synced int   // dead letters recorded
	Err    error // the run's failures, joined; the next run tries again
}

// ErrInvalidJanitor reports bad [JanitorOptions].
var ErrInvalidJanitor = errors.New("ledger: invalid janitor options")

// RunJanitor keeps the ledger bounded and its dead jobs true until ctx is
// done, then returns ctx's error: every Interval it purges the jobs that
// finished more than Retention ago and those that never finished, idle for
// StaleRetention, in batches (each its own short
// statement, so a backlog never holds long locks nor much memory), and syncs
// the dead-letter queues it is given. It runs on the caller's goroutine,
// which owns it: cancel ctx to stop it. A failed run is reported and tried
// again at the next tick.
func RunJanitor(ctx context.Context, o JanitorOptions) error {
	if o.Purger == nil && len(o.DeadLetterQueues) == 0 {
		return fmt.Errorf("%w: nothing to do (no Purger, no DeadLetterQueues)", ErrInvalidJanitor)
	}
	if len(o.DeadLetterQueues) > 0 && (o.Ledger == nil || o.DeadLetters == nil) {
		return fmt.Errorf("%w: DeadLetterQueues need Ledger and DeadLetters", ErrInvalidJanitor)
	}
	if o.Retention < 0 || o.Interval < 0 || o.Batch < 0 {
		return fmt.Errorf("%w: negative Retention, Interval or Batch", ErrInvalidJanitor)
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	_, stale := o.Purger.(StalePurger)
	switch {
	case o.StaleRetention > 0 && !stale:
		return fmt.Errorf("%w: StaleRetention needs a Purger that is a StalePurger (%T is not)", ErrInvalidJanitor, o.Purger)
	case o.StaleRetention > 0 && o.StaleRetention < o.Retention:
		return fmt.Errorf("%w: StaleRetention %s shorter than Retention %s", ErrInvalidJanitor, o.StaleRetention, o.Retention)
	case o.StaleRetention == 0 && stale:
		o.StaleRetention = DefaultStaleRetentionFactor * o.Retention
		if o.StaleRetention/DefaultStaleRetentionFactor != o.Retention { // overflowed
			o.StaleRetention = math.MaxInt64
		}
	}
	if o.Interval == 0 {
		o.Interval = DefaultJanitorInterval
	}
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	cursors := map[string]string{}
	for {
		r := janitorRun(ctx, o, cursors)
		if o.Report != nil && ctx.Err() == nil {
			o.Report(r)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// deadLetterPager is a dead-letter queue read page by page, oldest first:
// up to limit letters after cursor ("" for the first page), and the next
// page's cursor ("" after the last page).
type deadLetterPager interface {
	DeadLetterPage(ctx context.Context, queue, cursor string, limit int) ([]*sdk.Message, string, error)
}

// janitorRun is one run; cursors holds, per queue, where the next run's
// page of dead letters starts (with a deadLetterPager).
func janitorRun(ctx context.Context, o JanitorOptions, cursors map[string]string) JanitorRun {
	var r JanitorRun
	var errs []error
	var cutoff time.Time
	if o.Purger != nil {
		cutoff = time.Now().Add(-o.Retention)
		n, err := o.Purger.Purge(ctx, cutoff, o.Batch)
		r.Purged = n
		if err != nil {
			errs = append(errs, err)
		}
		if sp, ok := o.Purger.(StalePurger); ok && o.StaleRetention > 0 && ctx.Err() == nil {
			n, err := sp.PurgeStale(ctx, time.Now().Add(-o.StaleRetention), o.Batch)
			r.Stale = n
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, q := range o.DeadLetterQueues {
		if ctx.Err() != nil {
			break
		}
		// Letters that died before the cutoff only end attempts still
		// open: their jobs are the purge's, not to be made again.
		var n int
		var err error
		listed := o.DeadLetters
		if w, ok := listed.(*deadLetters); ok { // Ledger.DeadLetters: listing is the broker's
			listed = w.DeadLetters
		}
		if p, ok := listed.(deadLetterPager); ok {
			var msgs []*sdk.Message
			var next string
			msgs, next, err = p.DeadLetterPage(ctx, q, cursors[q], o.DeadLetterLimit)
			if err != nil {
				// A cursor the queue no longer knows must not fail every
				// run: the next one starts over.
				next, err = "", fmt.Errorf("ledger: sync dead letters of %s: %w", q, err)
			}
			cursors[q] = next
			n = o.Ledger.recordDeadLetters(msgs, q, cutoff)
		} else {
			n, err = o.Ledger.syncDeadLetters(ctx, o.DeadLetters, q, o.DeadLetterLimit, cutoff)
		}
		r.Synced += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	r.Err = errors.Join(errs...)
	return r
}
