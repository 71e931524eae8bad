package pgledger

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

const jobCols = `message_id, queue, job_type, COALESCE(idempotency_key, ''), correlation_id, status, generation,
	attempts, COALESCE(last_error, ''), COALESCE(error_class, ''), next_attempt_at, first_seen_at, started_at,
	finished_at, duration_us, COALESCE(worker_id, ''), updated_at`

// scanJob reads jobCols and, when hist is not nil, the history column. It
// returns the row's first_seen_at as stored too, the position of a cursor.
// Times read as readTime says: 'infinity' is no scan error.
func scanJob(r pgx.Row, hist *[]byte) (ledger.Job, pgtype.Timestamptz, error) {
	var (
		j                                           ledger.Job
		status, class                               string
		next, firstSeen, started, finished, updated pgtype.Timestamptz
		dur                                         *int64
	)
	dest := []any{&j.MessageID, &j.Queue, &j.Type, &j.IdempotencyKey, &j.CorrelationID, &status, &j.Generation,
		&j.Attempts, &j.LastError, &class, &next, &firstSeen, &started, &finished, &dur, &j.Worker, &updated}
	if hist != nil {
		dest = append(dest, hist)
	}
	err := r.Scan(dest...)
	j.Status, j.ErrorClass = ledger.Status(status), sdk.ErrorClass(class)
	j.NextAttemptAt, j.FirstSeenAt, j.StartedAt, j.FinishedAt = readTime(next), readTime(firstSeen), readTime(started), readTime(finished)
	j.UpdatedAt, j.Duration = readTime(updated), micros(dur)
	return j, firstSeen, err
}

func micros(us *int64) time.Duration {
	if us == nil {
		return 0
	}
	return time.Duration(*us) * time.Microsecond
}

// Job returns the job with message ID id and its attempts. An unknown id
// gives an error wrapping [sdk.ErrNotFound]. Any time the row holds reads,
// 'infinity' and '-infinity' (written by hand or by another tool) as
// [ledger.Infinity] and [ledger.NegativeInfinity] (see there).
func (s *Store) Job(ctx context.Context, id string) (*ledger.Job, error) {
	return s.one(ctx, `SELECT `+jobCols+`, history FROM `+s.jobs+` WHERE message_id = $1`, "job "+sdk.ErrorText(id), id)
}

// JobByKey returns the most recently seen job with idempotency key key and
// its attempts. An unknown key gives an error wrapping [sdk.ErrNotFound].
func (s *Store) JobByKey(ctx context.Context, key string) (*ledger.Job, error) {
	return s.one(ctx, `SELECT `+jobCols+`, history FROM `+s.jobs+` WHERE idempotency_key = $1
ORDER BY first_seen_at DESC, message_id DESC LIMIT 1`, "job with key "+sdk.ErrorText(key), key)
}

func (s *Store) one(ctx context.Context, q, what string, arg string) (*ledger.Job, error) {
	var hist []byte
	// Text is stored with NUL and invalid UTF-8 replaced and a value too
	// long for its index shortened (storable), and PostgreSQL would refuse
	// the query with them: look it up likewise.
	j, _, err := scanJob(s.db.QueryRow(ctx, q, indexedText(arg)), &hist)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("pgledger: %s: %w", what, sdk.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("pgledger: %s: %w", what, err)
	}
	var entries []historyEntry
	if err := json.Unmarshal(hist, &entries); err != nil {
		return nil, fmt.Errorf("pgledger: %s: history: %w", what, err)
	}
	// Each attempt's newest state: of two deliveries of it (both starts
	// known and different), the one that started later, unless the other's
	// is final (succeeded, dead); within one, a later rank, else a later
	// time (as the store's guard orders them). The current attempt is the
	// row itself.
	type key struct{ gen, att int }
	// The start and worker come from any state of the attempt that has
	// them: a settlement may say neither, and its running state may have
	// been written after it.
	best := map[key]historyEntry{}
	for _, e := range entries {
		k := key{e.Generation, e.Attempt}
		b, ok := best[k]
		if !ok || entryNewer(e, b) {
			b, e = e, b
		}
		if b.StartedAt == nil {
			b.StartedAt = e.StartedAt
		}
		if b.WorkerID == nil {
			b.WorkerID = e.WorkerID
		}
		best[k] = b
	}
	for k, e := range best {
		if j.Attempts > 0 && j.Status.Rank() >= 1 && k == (key{j.Generation, j.Attempts}) {
			continue
		}
		a := ledger.Attempt{Generation: e.Generation, Attempt: e.Attempt, Status: ledger.Status(e.Status), StartedAt: e.StartedAt.time(),
			FinishedAt: e.FinishedAt.time(), Duration: micros(e.DurationUS), NextAttemptAt: e.NextAttemptAt.time()}
		if e.Error != nil {
			a.Error = *e.Error
		}
		if e.ErrorClass != nil {
			a.Class = sdk.ErrorClass(*e.ErrorClass)
		}
		if e.WorkerID != nil {
			a.Worker = *e.WorkerID
		}
		j.History = append(j.History, a)
	}
	if j.Attempts > 0 && j.Status.Rank() >= 1 {
		cur := ledger.Attempt{Generation: j.Generation, Attempt: j.Attempts, Status: j.Status, StartedAt: j.StartedAt,
			FinishedAt: j.FinishedAt, Duration: j.Duration, NextAttemptAt: j.NextAttemptAt, Worker: j.Worker}
		if j.Status == ledger.StatusRetrying || j.Status == ledger.StatusDead || j.Status == ledger.StatusReleased {
			cur.Error, cur.Class = j.LastError, j.ErrorClass
		}
		j.History = append(j.History, cur)
	}
	slices.SortFunc(j.History, func(a, b ledger.Attempt) int {
		return cmp.Or(cmp.Compare(a.Generation, b.Generation), cmp.Compare(a.Attempt, b.Attempt))
	})
	ledger.MarkAbandoned(j.History)
	return &j, nil
}

// List returns a page of the jobs f selects, newest first: by first seen,
// then by message ID (see [ledger.Reader]).
func (s *Store) List(ctx context.Context, f ledger.Filter) (ledger.Page, error) {
	f, err := f.Check()
	if err != nil {
		return ledger.Page{}, err
	}
	var statuses []string
	for _, st := range f.Statuses {
		statuses = append(statuses, string(st))
	}
	var afterT pgtype.Timestamptz // NULL: the first page
	var afterID string
	if f.After != "" {
		t, id, _ := ledger.DecodeCursor(f.After)
		afterT, afterID = queryTime(t), id
	}
	rows, err := s.db.Query(ctx, `SELECT `+jobCols+` FROM `+s.jobs+`
WHERE ($1 = '' OR queue = $1) AND ($2::text[] IS NULL OR status = ANY($2)) AND ($3 = '' OR job_type = $3)
	AND ($4::timestamptz IS NULL OR updated_at >= $4) AND ($5::timestamptz IS NULL OR updated_at < $5)
	AND ($6::timestamptz IS NULL OR (first_seen_at, message_id) < ($6, $7)) AND ($9 = '' OR idempotency_key = $9)
ORDER BY first_seen_at DESC, message_id DESC LIMIT $8`,
		indexedText(f.Queue), statuses, storableText(f.Type), filterTime(f.Since), filterTime(f.Until), afterT, indexedText(afterID), f.Limit+1,
		indexedText(f.IdempotencyKey))
	if err != nil {
		return ledger.Page{}, fmt.Errorf("pgledger: list: %w", err)
	}
	defer rows.Close()
	var (
		jobs  []ledger.Job
		first []pgtype.Timestamptz
	)
	for rows.Next() {
		j, fs, err := scanJob(rows, nil)
		if err != nil {
			return ledger.Page{}, fmt.Errorf("pgledger: list: %w", err)
		}
		jobs, first = append(jobs, j), append(first, fs)
	}
	if err := rows.Err(); err != nil {
		return ledger.Page{}, fmt.Errorf("pgledger: list: %w", err)
	}
	p := ledger.Page{Jobs: jobs}
	if len(jobs) > f.Limit {
		// The position of the last row shown as stored: its first seen
		// read clamped (a year after 9999, say) would end the page
		// elsewhere.
		p.Jobs = jobs[:f.Limit]
		p.Next = ledger.Cursor(cursorTime(first[f.Limit-1]), jobs[f.Limit-1].MessageID)
	}
	return p, nil
}

// Counts counts the jobs updated in w by status and, for those with an
// error class, by class.
func (s *Store) Counts(ctx context.Context, w ledger.Window) (ledger.Counts, error) {
	if err := checkWindow(w); err != nil {
		return ledger.Counts{}, err
	}
	rows, err := s.db.Query(ctx, `SELECT status, CASE WHEN status IN ('retrying', 'dead', 'released') THEN COALESCE(error_class, '') ELSE '' END,
	count(*) FROM `+s.jobs+`
WHERE ($1 = '' OR queue = $1) AND ($2::timestamptz IS NULL OR updated_at >= $2) AND ($3::timestamptz IS NULL OR updated_at < $3)
GROUP BY 1, 2`, indexedText(w.Queue), filterTime(w.Since), filterTime(w.Until))
	if err != nil {
		return ledger.Counts{}, fmt.Errorf("pgledger: counts: %w", err)
	}
	return collectCounts(rows)
}

func checkWindow(w ledger.Window) error {
	if !w.Until.IsZero() && !w.Since.IsZero() && w.Until.Before(w.Since) {
		return fmt.Errorf("%w: until %s before since %s", ledger.ErrInvalidFilter, w.Until, w.Since)
	}
	return nil
}

// collectCounts reads (status, class, count) rows. Classes are counted for
// the jobs that failed: retrying, dead, released with a cause.
func collectCounts(rows pgx.Rows) (ledger.Counts, error) {
	c := ledger.Counts{ByStatus: map[ledger.Status]int64{}, ByClass: map[sdk.ErrorClass]int64{}}
	var status, class string
	var n int64
	_, err := pgx.ForEachRow(rows, []any{&status, &class, &n}, func() error {
		c.ByStatus[ledger.Status(status)] += n
		if class != "" {
			c.ByClass[sdk.ErrorClass(class)] += n
		}
		return nil
	})
	if err != nil {
		return c, fmt.Errorf("pgledger: counts: %w", err)
	}
	return c, nil
}

// entryNewer reports whether history entry e is a newer state of its
// attempt than b (see Store.Job). Starts are compared to the microsecond,
// as the table keeps them: an entry the batch wrote has its start to the
// nanosecond, one the upsert copied from the row to the microsecond.
func entryNewer(e, b historyEntry) bool {
	if e.Rank < 3 && b.Rank < 3 && e.StartedAt != nil && b.StartedAt != nil {
		if c := e.StartedAt.t.Truncate(time.Microsecond).Compare(b.StartedAt.t.Truncate(time.Microsecond)); c != 0 {
			return c > 0
		}
	}
	return e.Rank > b.Rank || e.Rank == b.Rank && !e.UpdatedAt.t.Before(b.UpdatedAt.t)
}
