package ledger

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/berthq/berth/sdk"
)

// Job is one job's row: its current state and, where the reader keeps them,
// its attempts.
type Job struct {
	MessageID      string
	Queue          string
	Type           string
	IdempotencyKey string
	CorrelationID  string
	Status         Status
	Generation     int // redrives so far
	Attempts       int // attempts of the current generation
	LastError      string
	ErrorClass     sdk.ErrorClass
	NextAttemptAt  time.Time // retrying, released with a delay; enqueued with a delay: when it is due
	FirstSeenAt    time.Time
	StartedAt      time.Time     // the current attempt's start
	FinishedAt     time.Time     // the current attempt's end
	Duration       time.Duration // the current attempt's handler run time
	Worker         string        // who ran the current attempt
	UpdatedAt      time.Time
	// History lists every attempt of every generation, oldest first, when
	// the reader keeps them (pgledger.Store does; pgledger.Jobs, reading the
	// PostgreSQL broker's table, does not).
	History []Attempt
}

// Attempt is the outcome of one attempt.
type Attempt struct {
	Generation    int
	Attempt       int
	Status        Status // running, released, retrying, succeeded or dead
	StartedAt     time.Time
	FinishedAt    time.Time
	Duration      time.Duration
	Error         string
	Class         sdk.ErrorClass
	NextAttemptAt time.Time
	Worker        string
	// Abandoned: the attempt never settled and a later one exists — its
	// worker crashed or lost its lease.
	Abandoned bool
}

// Filter selects jobs for [Reader.List]. Zero fields select everything.
type Filter struct {
	Queue    string
	Statuses []Status
	Type     string
	// IdempotencyKey selects the jobs with this idempotency key: the
	// publishes of one operation ([Reader.JobByKey] gives only the newest).
	IdempotencyKey string
	// Since and Until bound the jobs' last update (Since inclusive, Until
	// exclusive); zero is no bound. [Infinity] and [NegativeInfinity]
	// stand for 'infinity' and '-infinity', as a Reader gives them.
	Since, Until time.Time
	// Limit bounds the page. Default 100, at most 1000.
	Limit int
	// After is the Next cursor of the previous page; empty for the first.
	After string
}

// Page is one page of a list, newest job first.
type Page struct {
	Jobs []Job
	// Next is the cursor of the next page, empty on the last.
	Next string
}

// Window bounds [Reader.Counts]: jobs updated in [Since, Until), of Queue
// when set. A zero Since or Until is no bound: with a zero Until, rows
// dated after now (a writer's clock ahead of this one) are counted too.
type Window struct {
	Queue        string
	Since, Until time.Time
}

// Counts are the jobs of a window per status and, among those that failed
// (retrying, dead, released with a cause), per error class.
type Counts struct {
	ByStatus map[Status]int64
	ByClass  map[sdk.ErrorClass]int64
}

// Reader answers the ledger's questions. It is implemented by
// pgledger.Store (the ledger's own tables) and pgledger.Jobs (the
// PostgreSQL broker's jobs table). Its methods may be called concurrently.
type Reader interface {
	// Job returns the job with message ID id, with its History when kept.
	// An unknown id gives an error wrapping [sdk.ErrNotFound].
	Job(ctx context.Context, id string) (*Job, error)
	// JobByKey returns the most recently seen job with idempotency key key
	// (several publishes of one operation share a key; List with
	// [Filter.IdempotencyKey] finds the others). An unknown key gives
	// [sdk.ErrNotFound].
	JobByKey(ctx context.Context, key string) (*Job, error)
	// List returns a page of the jobs f selects, newest job first (by when
	// it was first seen, then its ID; pgledger.Jobs: by its row's id, the
	// order rows were inserted), by keyset on that key, which an update
	// does not change: paging while rows change shows every job that
	// existed when paging began once, unless an update takes it out of f
	// (its status, or its last update out of Since and Until). Jobs first
	// seen after paging began come before the first page and are not
	// shown. (An order by last update could not promise that: a job
	// updated while paging would jump ahead of the cursor, unseen.)
	// (pgledger.Store only: a job whose first sighting an
	// out-of-order event moves earlier while paging may be shown again;
	// it is never skipped.) A bad filter or cursor gives
	// [ErrInvalidFilter].
	List(ctx context.Context, f Filter) (Page, error)
	// Counts counts the jobs of w by status and by error class.
	Counts(ctx context.Context, w Window) (Counts, error)
}

// ErrInvalidFilter reports a bad [Filter] or [Window]: an unknown status, a
// malformed cursor, a negative limit, Until before Since.
var ErrInvalidFilter = errors.New("ledger: invalid filter")

// Default and maximum page sizes of [Reader.List].
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Check validates f and returns it with its defaults, for Reader
// implementations.
func (f Filter) Check() (Filter, error) {
	for _, s := range f.Statuses {
		if !s.Valid() {
			return f, fmt.Errorf("%w: unknown status %q", ErrInvalidFilter, s)
		}
	}
	if f.Limit < 0 {
		return f, fmt.Errorf("%w: negative limit %d", ErrInvalidFilter, f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = DefaultLimit
	}
	f.Limit = min(f.Limit, MaxLimit)
	// A zero Since is no bound (not year 1): an Until before it, such as
	// NegativeInfinity, selects what it says.
	if !f.Until.IsZero() && !f.Since.IsZero() && f.Until.Before(f.Since) {
		return f, fmt.Errorf("%w: until %s before since %s", ErrInvalidFilter, f.Until, f.Since)
	}
	if f.After != "" {
		if _, _, err := DecodeCursor(f.After); err != nil {
			return f, err
		}
	}
	return f, nil
}

// Infinity and NegativeInfinity are the times a [Reader] gives for a
// timestamp PostgreSQL holds as 'infinity' or '-infinity' (a row written by
// hand or by another tool: PostgreSQL allows them), and for any time it
// holds after 9999 or before year 0, which RFC 3339, and so JSON, cannot
// write (time.Time.MarshalJSON fails on them): every time of a [Job] or an
// [Attempt] a Reader returns is one JSON can carry. They are the latest and
// almost the earliest times RFC 3339 writes: 9999-12-31T23:59:59.999999999Z
// and 0000-01-01T00:00:00.000000001Z. Both have nanoseconds, which no time
// PostgreSQL holds (it keeps microseconds) has, so that a reader, or a
// [Cursor], tells them from a time stored: compare with Equal. Tools showing
// a job may print them as "infinity" and "-infinity" (berth and the
// dashboard do).
var (
	Infinity         = time.Date(9999, time.December, 31, 23, 59, 59, 999999999, time.UTC)
	NegativeInfinity = time.Date(0, time.January, 1, 0, 0, 0, 1, time.UTC)
)

// Cursor encodes the keyset position after a job first seen at t with id.
// Reader implementations use it to build [Page.Next]. t may be any time
// PostgreSQL holds (before 1970 too, up to its latest, in year 294276), or
// [Infinity] or [NegativeInfinity] for 'infinity' and '-infinity'. The time
// is written as microseconds since the Unix epoch, in decimal: after year
// 294247 that number no longer fits an int64, and it is written out all
// the same (computing it as one wrapped round to a time before 1970, a
// cursor DecodeCursor refused: paging over such a row failed).
func Cursor(t time.Time, id string) string {
	var ts string
	switch sec := t.Unix(); {
	case t.Equal(Infinity):
		ts = "infinity"
	case t.Equal(NegativeInfinity):
		ts = "-infinity"
	case sec > 0:
		// sec*1e6 + µs, digit by digit: it may not fit an int64.
		ts = strconv.FormatInt(sec, 10) + fmt.Sprintf("%06d", t.Nanosecond()/1000)
	default:
		ts = strconv.FormatInt(t.UnixMicro(), 10)
	}
	return base64.RawURLEncoding.EncodeToString([]byte(ts + ":" + id))
}

// minCursorMicros is the earliest time a cursor may hold, in microseconds
// since the Unix epoch: PostgreSQL's earliest timestamp (4713 BC, Julian
// day 0). No stored job is older, so no [Cursor] of a page is; an earlier
// one would fail the reader's query (an error of the database, not
// [ErrInvalidFilter]), or wrap around when encoded.
const minCursorMicros = -210866803200000000

// maxCursorTime is the latest finite time PostgreSQL holds (its timestamps
// end before 294277-01-01 UTC), and so the latest a [Cursor] holds.
var maxCursorTime = time.Date(294276, time.December, 31, 23, 59, 59, 999999000, time.UTC)

// DecodeCursor reverses [Cursor]; a cursor of 'infinity' or '-infinity'
// gives [Infinity] or [NegativeInfinity]. A cursor comes from whoever sends
// it (a URL, a command line): a malformed one, or one holding a time
// PostgreSQL cannot (before 4713 BC, after year 294276), gives
// [ErrInvalidFilter].
func DecodeCursor(c string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err == nil {
		ts, id, ok := strings.Cut(string(b), ":")
		switch {
		case ok && ts == "infinity":
			return Infinity, id, nil
		case ok && ts == "-infinity":
			return NegativeInfinity, id, nil
		}
		if t, tok := cursorMicros(ts); ok && tok {
			return t, id, nil
		}
	}
	return time.Time{}, "", fmt.Errorf("%w: malformed cursor", ErrInvalidFilter)
}

// cursorMicros reads a cursor's time, microseconds since the Unix epoch in
// decimal: in an int64 up to year 294247, past it as all digits, the last
// six the microseconds. It is a time PostgreSQL holds, or not ok.
func cursorMicros(ts string) (time.Time, bool) {
	us, err := strconv.ParseInt(ts, 10, 64)
	if err == nil {
		return time.UnixMicro(us), us >= minCursorMicros
	}
	n := len(ts)
	if n <= 6 || strings.Trim(ts, "0123456789") != "" {
		return time.Time{}, false
	}
	sec, err := strconv.ParseInt(ts[:n-6], 10, 64)
	if err != nil || sec > maxCursorTime.Unix() { // also keeps time.Unix from wrapping round
		return time.Time{}, false
	}
	frac, _ := strconv.Atoi(ts[n-6:])
	t := time.Unix(sec, int64(frac)*1000)
	return t, !t.After(maxCursorTime)
}

// MarkAbandoned sets Abandoned on the attempts of h that never settled
// (running) and have a later attempt. h is ordered oldest first.
func MarkAbandoned(h []Attempt) {
	for i := range h {
		h[i].Abandoned = h[i].Status == StatusRunning && i < len(h)-1
	}
}
