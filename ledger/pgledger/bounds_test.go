package pgledger_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// boundRows are the last updates of the rows the bounds tests read, by
// name: 'infinity' and '-infinity', and finite times, some past what a
// reader returns as they are (after 9999, before year 0), one past year
// 294247 (beyond microseconds since 1970 in an int64).
var boundRows = map[string]string{
	"inf":     "infinity",
	"neginf":  "-infinity",
	"now":     "now",
	"y1900":   "1900-01-01 00:00:00+00",
	"y12000":  "12000-01-01 00:00:00+00",
	"bc":      "0044-03-15 12:00:00+00 BC",
	"y294260": "294260-01-01 00:00:00+00",
}

// checkBounds lists and counts r's jobs of queue with Since and Until set
// to ledger.Infinity and ledger.NegativeInfinity, which stand for
// 'infinity' and '-infinity' (they were sent as the finite times they
// also are, so '-infinity' rows were left out from Since -infinity and
// shown before Until -infinity, and finite rows after 9999 were on the
// wrong side of ±infinity), and to finite times PostgreSQL cannot be sent
// as they are or cannot hold. names maps a message ID to its row's name.
func checkBounds(t *testing.T, ctx context.Context, r ledger.Reader, queue string, names map[string]string) {
	t.Helper()
	all := func(but ...string) []string {
		var out []string
		for n := range boundRows {
			if !slices.Contains(but, n) {
				out = append(out, n)
			}
		}
		return out
	}
	y := func(year int) time.Time { return time.Date(year, time.January, 1, 0, 0, 0, 0, time.UTC) }
	cases := []struct {
		name         string
		since, until time.Time
		want         []string
	}{
		{"since -infinity", ledger.NegativeInfinity, time.Time{}, all()},
		{"until -infinity", time.Time{}, ledger.NegativeInfinity, nil},
		{"since infinity", ledger.Infinity, time.Time{}, []string{"inf"}},
		{"until infinity", time.Time{}, ledger.Infinity, all("inf")},
		{"-infinity to infinity", ledger.NegativeInfinity, ledger.Infinity, all("inf")},
		{"since 294250", y(294250), time.Time{}, []string{"inf", "y294260"}},
		{"until 294250", time.Time{}, y(294250), all("inf", "y294260")},
		{"since 300000", y(300000), time.Time{}, []string{"inf"}},
		{"until 300000", time.Time{}, y(300000), all("inf")},
		{"since 5000 BC", y(-4999), time.Time{}, all("neginf")},
		{"until 5000 BC", time.Time{}, y(-4999), []string{"neginf"}},
		{"12000 to 294250", y(12000), y(294250), []string{"y12000"}},
	}
	for _, c := range cases {
		p, err := r.List(ctx, ledger.Filter{Queue: queue, Since: c.since, Until: c.until, Limit: 100})
		if err != nil {
			t.Errorf("%s: List: %v", c.name, err)
			continue
		}
		var got []string
		for _, j := range p.Jobs {
			got = append(got, names[j.MessageID])
		}
		slices.Sort(got)
		want := slices.Sorted(slices.Values(c.want))
		if !slices.Equal(got, want) {
			t.Errorf("%s: List shows %v; want %v", c.name, got, want)
		}
		cs, err := r.Counts(ctx, ledger.Window{Queue: queue, Since: c.since, Until: c.until})
		if err != nil {
			t.Errorf("%s: Counts: %v", c.name, err)
			continue
		}
		var n int64
		for _, k := range cs.ByStatus {
			n += k
		}
		if n != int64(len(want)) {
			t.Errorf("%s: Counts counts %d; want %d", c.name, n, len(want))
		}
	}
}

// setUpdated sets the last update of the row where col = key to v (a
// boundRows value).
func setUpdated(t *testing.T, ctx context.Context, pool *pgxpool.Pool, table, col, key, v string) {
	t.Helper()
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET updated_at = $2::timestamptz WHERE `+col+` = $1`, key, v); err != nil {
		t.Fatal(err)
	}
}

// TestStoreBoundsAnyTime: Filter and Window bounds on the ledger's table.
func TestStoreBoundsAnyTime(t *testing.T) {
	pool, s, ctx := setup(t)
	now := time.Now()
	names := map[string]string{}
	var events []ledger.Event
	for n := range boundRows {
		names[n] = n
		events = append(events, ledger.Event{MessageID: n, Queue: "bounds", Type: "t", Status: ledger.StatusEnqueued, At: now})
	}
	if err := s.Write(ctx, events); err != nil {
		t.Fatal(err)
	}
	for n, v := range boundRows {
		setUpdated(t, ctx, pool, s.Table(), "message_id", n, v)
	}
	checkBounds(t, ctx, s, "bounds", names)
}

// TestJobsBoundsAnyTime: the same on the PostgreSQL broker's jobs table.
func TestJobsBoundsAnyTime(t *testing.T) {
	ctx, pool, b, schema := jobsBroker(t)
	names := map[string]string{}
	for n, v := range boundRows {
		m := &sdk.Message{Type: "t", Body: []byte(`{}`)}
		if err := b.Publish(ctx, "bounds", m); err != nil {
			t.Fatal(err)
		}
		names[m.ID] = n
		setUpdated(t, ctx, pool, schema+".jobs", "message_id", m.ID, v)
	}
	r, err := pgledger.NewJobs(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	checkBounds(t, ctx, r, "bounds", names)
}

// TestStorePagesPastYear294247: a job first seen after year 294247
// (PostgreSQL holds times to 294276) pages on. Its cursor was its
// microseconds since 1970 in an int64, which wrapped round to a time
// before 4713 BC: the next page failed with ErrInvalidFilter, a malformed
// cursor the reader had made itself.
func TestStorePagesPastYear294247(t *testing.T) {
	pool, s, ctx := setup(t)
	now := time.Now()
	firstSeen := map[string]string{
		"last":    "294276-12-31 23:59:59.999999+00",
		"y294260": "294260-06-01 12:00:00.5+00",
		"y294247": "294247-01-10 04:00:54.775807+00", // the latest an int64 holds
		"now":     "",
	}
	var events []ledger.Event
	for id := range firstSeen {
		events = append(events, ledger.Event{MessageID: id, Queue: "far", Type: "t", Status: ledger.StatusEnqueued, At: now})
	}
	// Two rows at one far time: the page between them ends on it.
	events = append(events, ledger.Event{MessageID: "y294260b", Queue: "far", Type: "t", Status: ledger.StatusEnqueued, At: now})
	firstSeen["y294260b"] = firstSeen["y294260"]
	if err := s.Write(ctx, events); err != nil {
		t.Fatal(err)
	}
	setFirstSeen(t, ctx, pool, s, firstSeen)
	ids := listAll(t, ctx, s, "far")
	want := []string{"last", "y294260b", "y294260", "y294247", "now"}
	if !slices.Equal(ids, want) {
		t.Fatalf("List pages show %v; want %v, each once", ids, want)
	}
	// A cursor past the latest time PostgreSQL holds is a bad filter.
	p, err := s.List(ctx, ledger.Filter{Queue: "far", Limit: 1})
	if err != nil || p.Next == "" {
		t.Fatalf("first page: %+v, %v", p, err)
	}
	if _, err := s.List(ctx, ledger.Filter{After: ledger.Cursor(time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC), "x")}); !errors.Is(err, ledger.ErrInvalidFilter) {
		t.Errorf("a cursor after year 294276: %v; want ErrInvalidFilter", err)
	}
}
