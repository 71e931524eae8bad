package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// The job verbs read the job-state ledger (package ledger): the ledger's
// own tables in -db (fed on RabbitMQ, SQS and memory), or, on the
// PostgreSQL broker of -url, its jobs table.

// openLedger returns the ledger reader of -db (default $BERTH_DB), else of
// the PostgreSQL broker of -url.
func (c *cli) openLedger(ctx context.Context) (ledger.Reader, func(), error) {
	dsn := c.db
	if dsn == "" {
		dsn = c.getenv("BERTH_DB")
	}
	if dsn != "" {
		pool, err := c.openDBFor(ctx, dsn, "ledger")
		if err != nil {
			return nil, nil, err
		}
		s, err := pgledger.New(pool, pgledger.Options{Schema: c.schema})
		if err != nil {
			pool.Close()
			if errors.Is(err, pgledger.ErrInvalidOptions) {
				return nil, nil, &usageError{err.Error()}
			}
			return nil, nil, err
		}
		if err := ledgerFound(ctx, pool, c.schema, s.Table()); err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, pool.Close, nil
	}
	if c.url == "" {
		return nil, nil, usagef("no ledger: give -db (the PostgreSQL the ledger writes to) or the -url of a PostgreSQL broker, or set BERTH_DB or BERTH_URL")
	}
	b, err := c.broker(ctx)
	if err != nil {
		return nil, nil, err
	}
	var (
		pb   *postgres.Broker
		pool *pgxpool.Pool
	)
	as, ok := b.(interface{ As(any) bool })
	if !ok || !as.As(&pb) || !as.As(&pool) {
		_ = b.Close()
		return nil, nil, usagef("this broker keeps no job state: give -db, the PostgreSQL its ledger writes to (package ledger)")
	}
	j, err := pgledger.NewJobs(pool, pb.Schema())
	if err != nil {
		_ = b.Close()
		return nil, nil, err
	}
	return j, func() { _ = b.Close() }, nil
}

// ledgerMissing is the error of a -db whose -schema holds no ledger table:
// not found (exit 3). A mistyped -schema used to fail each read with
// PostgreSQL's "relation does not exist" (exit 1), and berth ui served job
// pages that all failed, after creating the schema for its pause table.
type ledgerMissing struct {
	notFoundError
	schemaFound bool // the schema exists; the table does not
}

// ledgerFound returns a *ledgerMissing when table (quoted, in schema, the
// default when "") is not in the database of pool.
func ledgerFound(ctx context.Context, pool *pgxpool.Pool, schema, table string) error {
	if schema == "" {
		schema = pgledger.DefaultSchema
	}
	schemaFound, tableFound, err := schemaTable(ctx, pool, schema, table)
	if err != nil {
		return fmt.Errorf("ledger table: %w", err)
	}
	switch {
	case tableFound:
		return nil
	case !schemaFound:
		return &ledgerMissing{notFoundError: notFoundError{fmt.Sprintf("schema \"%s\" does not exist in -db: no ledger there, and berth creates no schema "+
			"(give -schema the schema of the ledger the Workers write; pgledger.Store.Migrate creates its table)", esc(schema))}}
	default:
		return &ledgerMissing{schemaFound: true, notFoundError: notFoundError{fmt.Sprintf("no ledger table %s in -db: no job state was ever written there "+
			"(is -schema the schema of the ledger the Workers write? pgledger.Store.Migrate creates the table)", esc(table))}}
	}
}

// The -json documents of the job verbs. Fields are only ever added.

type jsonAttempt struct {
	Generation    int        `json:"generation"`
	Attempt       int        `json:"attempt"`
	Status        string     `json:"status"`
	StartedAt     *time.Time `json:"started_at"`
	FinishedAt    *time.Time `json:"finished_at"`
	DurationSec   float64    `json:"duration_seconds"`
	Error         string     `json:"error"`
	Class         string     `json:"class"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	Worker        string     `json:"worker"`
	Abandoned     bool       `json:"abandoned"`
}

type jsonJob struct {
	ID             string        `json:"id"`
	Queue          string        `json:"queue"`
	Type           string        `json:"type"`
	IdempotencyKey string        `json:"idempotency_key"`
	CorrelationID  string        `json:"correlation_id"`
	Status         string        `json:"status"`
	Generation     int           `json:"generation"`
	Attempts       int           `json:"attempts"`
	LastError      string        `json:"last_error"`
	ErrorClass     string        `json:"error_class"`
	NextAttemptAt  *time.Time    `json:"next_attempt_at"`
	FirstSeenAt    *time.Time    `json:"first_seen_at"`
	StartedAt      *time.Time    `json:"started_at"`
	FinishedAt     *time.Time    `json:"finished_at"`
	DurationSec    float64       `json:"duration_seconds"`
	Worker         string        `json:"worker"`
	UpdatedAt      *time.Time    `json:"updated_at"`
	History        []jsonAttempt `json:"history"` // empty where the ledger keeps none (the PostgreSQL broker's table)
	// SameKeyIDs (job show only) are the IDs of the other jobs with this
	// job's idempotency key, newest first, at most sameKeyMax of them;
	// SameKeyMore says there are more.
	SameKeyIDs  []string `json:"same_key_ids,omitempty"`
	SameKeyMore bool     `json:"same_key_more,omitempty"`
	// SameKeyError says why the other jobs of the key were not read (the
	// job itself was).
	SameKeyError string `json:"same_key_error,omitempty"`
}

type jsonJobs struct {
	Total *int64    `json:"total"` // every matching job, not just this page; null with -type (not counted)
	Next  *string   `json:"next"`  // the -after of the next page; null on the last
	Jobs  []jsonJob `json:"jobs"`
}

func tp(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func viewJob(j *ledger.Job) jsonJob {
	v := jsonJob{ID: j.MessageID, Queue: j.Queue, Type: j.Type, IdempotencyKey: j.IdempotencyKey, CorrelationID: j.CorrelationID,
		Status: string(j.Status), Generation: j.Generation, Attempts: j.Attempts, LastError: j.LastError, ErrorClass: string(j.ErrorClass),
		NextAttemptAt: tp(j.NextAttemptAt), FirstSeenAt: tp(j.FirstSeenAt), StartedAt: tp(j.StartedAt), FinishedAt: tp(j.FinishedAt),
		DurationSec: j.Duration.Seconds(), Worker: j.Worker, UpdatedAt: tp(j.UpdatedAt), History: []jsonAttempt{}}
	for _, a := range j.History {
		v.History = append(v.History, jsonAttempt{Generation: a.Generation, Attempt: a.Attempt, Status: string(a.Status),
			StartedAt: tp(a.StartedAt), FinishedAt: tp(a.FinishedAt), DurationSec: a.Duration.Seconds(), Error: a.Error,
			Class: string(a.Class), NextAttemptAt: tp(a.NextAttemptAt), Worker: a.Worker, Abandoned: a.Abandoned})
	}
	return v
}

// when shows a job's time: "-" when unset, "infinity" and "-infinity" for
// what a ledger reader gives for those (ledger.Infinity, also a time after
// 9999, and ledger.NegativeInfinity), else RFC 3339 in UTC. (-json writes
// those two as the times they are.)
func when(t time.Time) string {
	switch {
	case t.IsZero():
		return "-"
	case t.Equal(ledger.Infinity):
		return "infinity"
	case t.Equal(ledger.NegativeInfinity):
		return "-infinity"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func runJobShow(ctx context.Context, c *cli, args []string) error {
	if len(args) != 1 {
		return usagef("want exactly one ID or idempotency key, got %d arguments", len(args))
	}
	r, closeLedger, err := c.openLedger(ctx)
	if err != nil {
		return err
	}
	defer closeLedger()
	j, err := r.Job(ctx, args[0])
	if errors.Is(err, sdk.ErrNotFound) {
		j, err = r.JobByKey(ctx, args[0])
	}
	if errors.Is(err, sdk.ErrNotFound) {
		return fmt.Errorf("no job with ID or idempotency key \"%s\": %w", esc(args[0]), sdk.ErrNotFound)
	}
	if err != nil {
		return err
	}
	// The other jobs of its key are a second read, within its own bound:
	// on the PostgreSQL broker's table no index is keyed by the idempotency
	// key alone, and a slow or failed read must not cost the job found.
	kctx, kcancel := context.WithTimeout(ctx, sameKeyTimeout)
	same, more, keyErr := sameKey(kctx, r, j)
	kcancel()
	if keyErr != nil && ctx.Err() != nil {
		return keyErr // interrupted, or the command's -timeout
	}
	if c.json {
		v := viewJob(j)
		v.SameKeyMore = more
		if keyErr != nil {
			v.SameKeyError = keyErr.Error()
		}
		for _, o := range same {
			v.SameKeyIDs = append(v.SameKeyIDs, o.MessageID)
		}
		return writeJSON(c.stdout, v)
	}
	w := c.stdout
	fmt.Fprintf(w, "id:              %s\nqueue:           %s\ntype:            %s\n", esc(j.MessageID), esc(j.Queue), esc(j.Type))
	if j.IdempotencyKey != "" {
		fmt.Fprintf(w, "idempotency key: %s\n", esc(j.IdempotencyKey))
	}
	if j.CorrelationID != "" {
		fmt.Fprintf(w, "correlation id:  %s\n", esc(j.CorrelationID))
	}
	fmt.Fprintf(w, "status:          %s\nattempts:        %d", j.Status, j.Attempts)
	if j.Generation > 0 {
		fmt.Fprintf(w, " (after %d redrive(s))", j.Generation)
	}
	fmt.Fprintln(w)
	if j.LastError != "" {
		fmt.Fprintf(w, "last error:      %s", oneLine(j.LastError, 200))
		if j.ErrorClass != "" {
			fmt.Fprintf(w, " [%s]", esc(string(j.ErrorClass)))
		}
		fmt.Fprintln(w)
	}
	if !j.NextAttemptAt.IsZero() {
		fmt.Fprintf(w, "next attempt:    %s\n", when(j.NextAttemptAt))
	}
	fmt.Fprintf(w, "first seen:      %s\nstarted:         %s\nfinished:        %s\n", when(j.FirstSeenAt), when(j.StartedAt), when(j.FinishedAt))
	if j.Duration > 0 {
		fmt.Fprintf(w, "duration:        %s\n", j.Duration)
	}
	if j.Worker != "" {
		fmt.Fprintf(w, "worker:          %s\n", esc(j.Worker))
	}
	fmt.Fprintf(w, "updated:         %s\n", when(j.UpdatedAt))
	if len(j.History) > 0 {
		fmt.Fprintln(w, "attempts:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  #\tSTATUS\tSTARTED\tDURATION\tWORKER\tERROR")
		for _, a := range j.History {
			n := fmt.Sprint(a.Attempt)
			if a.Generation > 0 {
				n = fmt.Sprintf("%d.%d", a.Generation, a.Attempt)
			}
			status := string(a.Status)
			if a.Abandoned {
				status += " (abandoned: never settled)"
			}
			e := oneLine(a.Error, 80)
			if a.Class != "" {
				e += " [" + esc(string(a.Class)) + "]"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", n, status, when(a.StartedAt), a.Duration, oneLine(a.Worker, 30), e)
		}
		_ = tw.Flush()
	}
	if keyErr != nil {
		fmt.Fprintf(w, "same idempotency key: the other jobs were not read: %s\n", errText(keyErr))
	}
	if len(same) > 0 {
		// Two publishes of one operation (a charge made twice) are two
		// jobs under one key: the one shown is not all of it.
		fmt.Fprintf(w, "same idempotency key: %d other job(s), newest first (berth job show ID):\n", len(same))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, o := range same {
			fmt.Fprintf(tw, "  %s\t%s\tfirst seen %s\n", esc(o.MessageID), o.Status, when(o.FirstSeenAt))
		}
		_ = tw.Flush()
		if more {
			fmt.Fprintf(w, "  … and more (the newest %d are named)\n", sameKeyMax)
		}
	}
	return nil
}

// sameKeyMax is how many other jobs with its idempotency key job show names.
const sameKeyMax = 20

// sameKeyTimeout bounds job show's read of the other jobs with the key: a
// var for tests.
var sameKeyTimeout = 10 * time.Second

// sameKey returns the other jobs with j's idempotency key (none when it has
// none), newest first, at most sameKeyMax, and whether there are more.
func sameKey(ctx context.Context, r ledger.Reader, j *ledger.Job) ([]ledger.Job, bool, error) {
	if j.IdempotencyKey == "" {
		return nil, false, nil
	}
	p, err := r.List(ctx, ledger.Filter{IdempotencyKey: j.IdempotencyKey, Limit: sameKeyMax + 1})
	if err != nil {
		return nil, false, fmt.Errorf("the other jobs with its idempotency key: %w", err)
	}
	var out []ledger.Job
	shown := false
	for _, o := range p.Jobs {
		// The job shown, once: on the PostgreSQL broker's table another
		// row may have its ID.
		if !shown && o.MessageID == j.MessageID && o.FirstSeenAt.Equal(j.FirstSeenAt) {
			shown = true
			continue
		}
		out = append(out, o)
	}
	more := p.Next != "" || len(out) > sameKeyMax
	return out[:min(len(out), sameKeyMax)], more, nil
}

func runJobs(ctx context.Context, c *cli, args []string) error {
	if len(args) != 0 {
		return usagef("jobs takes no arguments; choose with -queue, -status, -type, -since")
	}
	if strings.Contains(c.types, ",") {
		return usagef("jobs: -type takes one type")
	}
	if c.since < 0 {
		return usagef("-since must be positive")
	}
	after, since, err := parseJobsCursor(c.after)
	if err != nil {
		return err
	}
	f := ledger.Filter{Queue: c.queue, Type: c.types, Limit: c.limit, After: after}
	if f.Limit == 0 {
		f.Limit = 50
	}
	if c.status != "" {
		for _, s := range strings.Split(c.status, ",") {
			st := ledger.Status(strings.TrimSpace(s))
			if !st.Valid() {
				return usagef("-status \"%s\": want one or more of %s", esc(s), statusNames())
			}
			f.Statuses = append(f.Statuses, st)
		}
	}
	switch {
	case !since.IsZero():
		// The next page of a -since listing: the window the first page
		// read, not one counted again from now, which would have slid
		// between the pages and passed over the jobs it left behind.
		f.Since = since
	case c.since > 0:
		f.Since = c.clock().Add(-c.since)
	}
	r, closeLedger, err := c.openLedger(ctx)
	if err != nil {
		return err
	}
	defer closeLedger()
	p, err := r.List(ctx, f)
	if errors.Is(err, ledger.ErrInvalidFilter) {
		return &usageError{err.Error()}
	}
	if err != nil {
		return err
	}
	// The total counts every matching job (Counts has no type filter).
	var total *int64
	if f.Type == "" {
		cs, err := r.Counts(ctx, ledger.Window{Queue: f.Queue, Since: f.Since})
		if err != nil {
			return err
		}
		var n int64
		for st, k := range cs.ByStatus {
			if len(f.Statuses) == 0 || contains(statusStrings(f.Statuses), string(st)) {
				n += k
			}
		}
		total = &n
	}
	next := jobsCursor(p.Next, f.Since)
	if c.json {
		v := jsonJobs{Total: total, Jobs: make([]jsonJob, 0, len(p.Jobs))}
		if next != "" {
			v.Next = &next
		}
		for i := range p.Jobs {
			v.Jobs = append(v.Jobs, viewJob(&p.Jobs[i]))
		}
		if err := writeJSON(c.stdout, v); err != nil {
			return err
		}
	} else {
		if len(p.Jobs) > 0 {
			tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tQUEUE\tTYPE\tSTATUS\tATTEMPTS\tUPDATED\tNEXT ATTEMPT\tLAST ERROR")
			var cut bool
			for _, j := range p.Jobs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", idCell(j.MessageID, &cut), oneLine(j.Queue, 30), oneLine(j.Type, 40), j.Status,
					j.Attempts, when(j.UpdatedAt), when(j.NextAttemptAt), oneLine(j.LastError, 80))
			}
			_ = tw.Flush()
			if cut {
				fmt.Fprintln(c.stdout, cutIDsNote)
			}
		}
		fmt.Fprintf(c.stdout, "%d job(s) shown", len(p.Jobs))
		if total != nil {
			fmt.Fprintf(c.stdout, " of %d matching", *total)
		}
		fmt.Fprintln(c.stdout)
		if next != "" {
			fmt.Fprintf(c.stdout, "next page: -after %s\n", esc(next))
		}
	}
	if len(p.Jobs) == 0 {
		return fmt.Errorf("jobs: %w", errNothing)
	}
	return nil
}

// jobsCursor is the -after of the page after one read with f.Since since
// and whose ledger cursor is next ("" on the last page): next, and with
// -since the start of the window, as microseconds since the Unix epoch
// after a ".", which no ledger cursor (base64url) holds. The next page
// reads the same window, however long after the first it is asked for.
func jobsCursor(next string, since time.Time) string {
	if next == "" || since.IsZero() {
		return next
	}
	return next + "." + strconv.FormatInt(since.UnixMicro(), 10)
}

// parseJobsCursor reverses [jobsCursor]: the ledger's cursor and the start
// of the window (zero when the cursor holds none). -after comes from the
// command line: a window that is not a time PostgreSQL can hold (years 1
// to 9999 here) is a usage error, as a malformed ledger cursor is.
func parseJobsCursor(after string) (string, time.Time, error) {
	cur, us, ok := strings.Cut(after, ".")
	if !ok {
		return after, time.Time{}, nil
	}
	n, err := strconv.ParseInt(us, 10, 64)
	if t := time.UnixMicro(n).UTC(); err == nil && t.Year() >= 1 && t.Year() <= 9999 && cur != "" {
		return cur, t, nil
	}
	return "", time.Time{}, usagef("-after: malformed cursor: give the one the previous page printed")
}

func statusNames() string { return strings.Join(statusStrings(ledger.Statuses), ", ") }

func statusStrings(ss []ledger.Status) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}
