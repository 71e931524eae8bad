package pgledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/berthq/berth/ledger"
)

// Every time the readers return comes through here: a row may hold any time
// PostgreSQL holds, 'infinity' and '-infinity' included (written by hand or
// by another tool), which a time.Time scan refuses, failing the whole read
// (berth jobs list and show, the dashboard's job pages). They read as
// ledger.Infinity and ledger.NegativeInfinity, and so do times RFC 3339
// cannot write (see there).

// earliest is the earliest time readTime returns as it is: the start of
// year 0, the first RFC 3339 writes.
var earliest = time.Date(0, time.January, 1, 0, 0, 0, 0, time.UTC)

// readTime is ts as a reader returns it: zero when NULL, else clamped as
// clampTime.
func readTime(ts pgtype.Timestamptz) time.Time {
	switch {
	case !ts.Valid:
		return time.Time{}
	case ts.InfinityModifier == pgtype.Infinity:
		return ledger.Infinity
	case ts.InfinityModifier == pgtype.NegativeInfinity:
		return ledger.NegativeInfinity
	}
	return clampTime(ts.Time)
}

// clampTime is t, or ledger.Infinity for a time after it (a year after
// 9999), or ledger.NegativeInfinity for one before year 0.
func clampTime(t time.Time) time.Time {
	switch {
	case t.After(ledger.Infinity):
		return ledger.Infinity
	case t.Before(earliest):
		return ledger.NegativeInfinity
	}
	return t
}

// cursorTime is the position of a row whose time is ts, for ledger.Cursor:
// the time as stored (not clamped: a page must end where its last row is),
// or ledger.Infinity or ledger.NegativeInfinity, which no stored time
// equals.
func cursorTime(ts pgtype.Timestamptz) time.Time {
	switch ts.InfinityModifier {
	case pgtype.Infinity:
		return ledger.Infinity
	case pgtype.NegativeInfinity:
		return ledger.NegativeInfinity
	}
	return ts.Time
}

// queryTime reverses cursorTime, for a query's parameter: ledger.Infinity
// and ledger.NegativeInfinity are 'infinity' and '-infinity'. Any finite
// time PostgreSQL holds goes as it is, after year 294247 too: pgx computes
// its microseconds since 2000 through those since 1970, which overflow an
// int64 there, but wrap back into range when the difference is taken.
func queryTime(t time.Time) pgtype.Timestamptz {
	switch {
	case t.Equal(ledger.Infinity):
		return pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	case t.Equal(ledger.NegativeInfinity):
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	return pgtype.Timestamptz{Time: t, Valid: true}
}

// The finite times PostgreSQL holds: from 4714-11-24 BC (Julian day 0) to
// the end of year 294276, UTC.
var (
	minStored = time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC)
	maxStored = time.Date(294276, time.December, 31, 23, 59, 59, 999999000, time.UTC)
)

// filterTime is a bound of a [ledger.Filter] or [ledger.Window] (Since,
// Until) as a query parameter: NULL when zero (no bound), and else a bound
// that selects the rows t selects. ledger.Infinity and
// ledger.NegativeInfinity are 'infinity' and '-infinity' (what a reader
// gives for them: a bound taken from a job it returned selects as the
// job's time; sent as the finite times they also are, they put rows
// holding 'infinity' or '-infinity' on the wrong side). A time after the
// latest PostgreSQL holds is beyond every finite one, as 'infinity' is; one
// before the earliest is before every finite one, as the earliest is (but
// not '-infinity', which is before it): PostgreSQL would refuse either.
func filterTime(t time.Time) pgtype.Timestamptz {
	switch {
	case t.IsZero():
		return pgtype.Timestamptz{} // NULL
	case t.After(maxStored):
		return queryTime(ledger.Infinity)
	case t.Before(minStored):
		return queryTime(minStored)
	}
	return queryTime(t)
}

// historyTime is a time of the history column. It is written as time.Time
// writes itself; it is read back in that form, and also in the forms
// PostgreSQL's jsonb writes a timestamptz (the upsert copies a row's times
// there): "infinity" and "-infinity", a year of more than four digits, a
// year before 1 with " BC", an offset with seconds (a zone's local mean time
// before 1900, say). It reads clamped as readTime.
type historyTime struct{ t time.Time }

// newHistoryTime is t as a history time, nil when t is zero.
func newHistoryTime(t time.Time) *historyTime {
	if t.IsZero() {
		return nil
	}
	return &historyTime{t}
}

// time is h's time, zero when h is nil.
func (h *historyTime) time() time.Time {
	if h == nil {
		return time.Time{}
	}
	return h.t
}

// MarshalJSON writes the time as time.Time does.
func (h historyTime) MarshalJSON() ([]byte, error) { return h.t.MarshalJSON() }

// UnmarshalJSON reads the forms of historyTime; null is the zero time.
func (h *historyTime) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		h.t = time.Time{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	t, err := parseStoredTime(s)
	if err != nil {
		return err
	}
	h.t = t
	return nil
}

// parseStoredTime reads a time of the history column (see historyTime).
func parseStoredTime(s string) (time.Time, error) {
	switch s {
	case "infinity":
		return ledger.Infinity, nil
	case "-infinity":
		return ledger.NegativeInfinity, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return clampTime(t), nil
	}
	bad := fmt.Errorf("pgledger: history: time %q", s)
	v, bc := strings.CutSuffix(s, " BC")
	i := strings.IndexByte(v, '-')
	if i < 4 {
		return time.Time{}, bad
	}
	year, err := strconv.Atoi(v[:i])
	if err != nil || year < 0 || bc && year < 1 {
		return time.Time{}, bad
	}
	if bc {
		year = 1 - year // 1 BC is year 0
	}
	// The rest, in a leap year (a 29 February parses); then the year.
	rest := "2000" + v[i:]
	for _, layout := range []string{"2006-01-02T15:04:05.999999999Z07:00", "2006-01-02T15:04:05.999999999Z07:00:00"} {
		t, err := time.Parse(layout, rest)
		if err == nil {
			return clampTime(time.Date(year, t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), t.Location())), nil
		}
	}
	return time.Time{}, bad
}
