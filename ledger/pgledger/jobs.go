package pgledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// Jobs reads the PostgreSQL broker's jobs table as a ledger: on that broker
// a job's state already is a row, so nothing is written twice (do not feed a
// [ledger.Ledger] there). It is safe for concurrent use.
//
// How the table's columns read:
//
//	queued, attempt_count 0     enqueued, or redriven when berth-redrive-count is set; NextAttemptAt =
//	                            available_at while that is in the future (a delayed publish, a release with a delay)
//	processing                  running (a lease, possibly expired: its worker may have crashed)
//	retry                       retrying, NextAttemptAt = available_at (also a job released after a failure)
//	completed                   succeeded
//	dead_letter, failed         dead, ErrorClass from the berth-dlq-class header
//	attempt_count               Attempts; Generation from berth-redrive-count
//	created_at, updated_at      FirstSeenAt, UpdatedAt (and FinishedAt once settled)
//
// Any time the table holds reads: 'infinity' and '-infinity' (a row another
// tool wrote), and a time after 9999 or before year 0, read as
// [ledger.Infinity] and [ledger.NegativeInfinity].
//
// The table keeps no attempt history, start time or handler duration: Job
// returns no History, and StartedAt and Duration are zero. Released is never
// reported (a released job reads as enqueued or retrying). List orders by
// the row's id (the order rows were inserted, which no update changes), so
// that paging neither skips nor repeats a job, as with [Store].
type Jobs struct {
	db    DB
	table string
}

var _ ledger.Reader = (*Jobs)(nil)

// NewJobs returns a reader of the jobs table in schema (default "berth",
// the broker's Options.Schema; validated as the broker does, an error
// wrapping [ErrInvalidOptions] and postgres.ErrInvalidSchema).
func NewJobs(db DB, schema string) (*Jobs, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil DB", ErrInvalidOptions)
	}
	if schema == "" {
		schema = DefaultSchema
	}
	if err := postgres.ValidateSchema(schema); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	return &Jobs{db: db, table: pgx.Identifier{schema, "jobs"}.Sanitize()}, nil
}

const (
	hRedrive = `headers->>'` + sdk.HeaderRedriveCount + `'`
	hClass   = `headers->>'` + sdk.HeaderDeadLetterClass + `'`
)

// statusSQL maps the table's status onto the ledger's.
const statusSQL = `CASE status WHEN 'queued' THEN CASE WHEN ` + hRedrive + ` IS NOT NULL THEN 'redriven' ELSE 'enqueued' END
	WHEN 'processing' THEN 'running' WHEN 'retry' THEN 'retrying' WHEN 'completed' THEN 'succeeded' ELSE 'dead' END`

// predicates select the rows of one ledger status.
var predicates = map[ledger.Status]string{
	ledger.StatusEnqueued:  `(status = 'queued' AND ` + hRedrive + ` IS NULL)`,
	ledger.StatusRedriven:  `(status = 'queued' AND ` + hRedrive + ` IS NOT NULL)`,
	ledger.StatusRunning:   `status = 'processing'`,
	ledger.StatusRetrying:  `status = 'retry'`,
	ledger.StatusSucceeded: `status = 'completed'`,
	ledger.StatusDead:      `status IN ('dead_letter', 'failed')`,
	ledger.StatusReleased:  `false`,
}

const jobsCols = `id, message_id, queue, job_type, COALESCE(idempotency_key, ''), correlation_id, ` + statusSQL + `,
	CASE WHEN ` + hRedrive + ` ~ '^[0-9]{1,9}$' THEN (` + hRedrive + `)::int ELSE 0 END,
	attempt_count, COALESCE(last_error, ''), CASE WHEN status IN ('dead_letter', 'failed') THEN COALESCE(` + hClass + `, '') ELSE '' END,
	CASE WHEN status = 'retry' OR status = 'queued' AND available_at > now() THEN available_at END, created_at,
	CASE WHEN status IN ('completed', 'dead_letter', 'failed', 'retry') THEN updated_at END,
	COALESCE(worker_id, ''), updated_at`

func scanJobsRow(r pgx.Row) (ledger.Job, int64, error) {
	var (
		j                                ledger.Job
		id                               int64
		status, class                    string
		next, created, finished, updated pgtype.Timestamptz
	)
	// Times read as readTime says: a row another tool wrote may hold
	// 'infinity' (available_at, say), which is no scan error.
	err := r.Scan(&id, &j.MessageID, &j.Queue, &j.Type, &j.IdempotencyKey, &j.CorrelationID, &status, &j.Generation,
		&j.Attempts, &j.LastError, &class, &next, &created, &finished, &j.Worker, &updated)
	j.Status, j.ErrorClass = ledger.Status(status), sdk.ErrorClass(class)
	j.NextAttemptAt, j.FirstSeenAt, j.FinishedAt, j.UpdatedAt = readTime(next), readTime(created), readTime(finished), readTime(updated)
	return j, id, err
}

// Job returns the newest job with message ID id. An unknown id gives an
// error wrapping [sdk.ErrNotFound].
func (s *Jobs) Job(ctx context.Context, id string) (*ledger.Job, error) {
	return s.one(ctx, `SELECT `+jobsCols+` FROM `+s.table+` WHERE message_id = $1 ORDER BY id DESC LIMIT 1`, "job "+sdk.ErrorText(id), id)
}

// JobByKey returns the newest job with idempotency key key. An unknown key
// gives an error wrapping [sdk.ErrNotFound].
func (s *Jobs) JobByKey(ctx context.Context, key string) (*ledger.Job, error) {
	return s.one(ctx, `SELECT `+jobsCols+` FROM `+s.table+` WHERE idempotency_key = $1 ORDER BY id DESC LIMIT 1`, "job with key "+sdk.ErrorText(key), key)
}

func (s *Jobs) one(ctx context.Context, q, what, arg string) (*ledger.Job, error) {
	// PostgreSQL refuses a query with a NUL or invalid UTF-8 (a URL can
	// carry them), which no row has (the broker refuses them at Publish):
	// with U+FFFD in their place the lookup finds nothing, not an error.
	j, _, err := scanJobsRow(s.db.QueryRow(ctx, q, storableText(arg)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("pgledger: %s: %w", what, sdk.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("pgledger: %s: %w", what, err)
	}
	return &j, nil
}

// List returns a page of the jobs f selects, newest first (by the row's
// id: see [ledger.Reader]).
func (s *Jobs) List(ctx context.Context, f ledger.Filter) (ledger.Page, error) {
	f, err := f.Check()
	if err != nil {
		return ledger.Page{}, err
	}
	where := []string{`($1 = '' OR queue = $1)`, `($2 = '' OR job_type = $2)`,
		`($3::timestamptz IS NULL OR updated_at >= $3)`, `($4::timestamptz IS NULL OR updated_at < $4)`,
		`($5::bigint IS NULL OR id < $5)`, `($7 = '' OR idempotency_key = $7)`}
	if len(f.Statuses) > 0 {
		var or []string
		for _, st := range f.Statuses {
			or = append(or, predicates[st])
		}
		where = append(where, "("+strings.Join(or, " OR ")+")")
	}
	var afterID *int64
	if f.After != "" {
		_, id, _ := ledger.DecodeCursor(f.After)
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			return ledger.Page{}, fmt.Errorf("%w: cursor of another reader", ledger.ErrInvalidFilter)
		}
		afterID = &n
	}
	rows, err := s.db.Query(ctx, `SELECT `+jobsCols+` FROM `+s.table+` WHERE `+strings.Join(where, " AND ")+`
ORDER BY id DESC LIMIT $6`,
		storableText(f.Queue), storableText(f.Type), filterTime(f.Since), filterTime(f.Until), afterID, f.Limit+1, storableText(f.IdempotencyKey))
	if err != nil {
		return ledger.Page{}, fmt.Errorf("pgledger: list: %w", err)
	}
	defer rows.Close()
	var jobs []ledger.Job
	var ids []int64
	for rows.Next() {
		j, id, err := scanJobsRow(rows)
		if err != nil {
			return ledger.Page{}, fmt.Errorf("pgledger: list: %w", err)
		}
		jobs, ids = append(jobs, j), append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return ledger.Page{}, fmt.Errorf("pgledger: list: %w", err)
	}
	p := ledger.Page{Jobs: jobs}
	if len(jobs) > f.Limit {
		p.Jobs = jobs[:f.Limit]
		p.Next = ledger.Cursor(jobs[f.Limit-1].FirstSeenAt, strconv.FormatInt(ids[f.Limit-1], 10))
	}
	return p, nil
}

// Counts counts the jobs updated in w by status and, for dead ones, by
// error class (the table keeps no class for retries).
func (s *Jobs) Counts(ctx context.Context, w ledger.Window) (ledger.Counts, error) {
	if err := checkWindow(w); err != nil {
		return ledger.Counts{}, err
	}
	rows, err := s.db.Query(ctx, `SELECT `+statusSQL+`,
	CASE WHEN status IN ('dead_letter', 'failed') THEN COALESCE(`+hClass+`, '') ELSE '' END, count(*) FROM `+s.table+`
WHERE ($1 = '' OR queue = $1) AND ($2::timestamptz IS NULL OR updated_at >= $2) AND ($3::timestamptz IS NULL OR updated_at < $3)
GROUP BY 1, 2`, storableText(w.Queue), filterTime(w.Since), filterTime(w.Until))
	if err != nil {
		return ledger.Counts{}, fmt.Errorf("pgledger: counts: %w", err)
	}
	return collectCounts(rows)
}
