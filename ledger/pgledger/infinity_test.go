package pgledger_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// listAll pages through r one job a page, failing on an error or a page
// that does not move on, and returns the IDs in the order shown.
func listAll(t *testing.T, ctx context.Context, r ledger.Reader, queue string) []string {
	t.Helper()
	var ids []string
	after := ""
	for range 100 {
		p, err := r.List(ctx, ledger.Filter{Queue: queue, Limit: 1, After: after})
		if err != nil {
			t.Fatalf("List after %q: %v", after, err)
		}
		for _, j := range p.Jobs {
			ids = append(ids, j.MessageID)
		}
		if p.Next == "" {
			return ids
		}
		if p.Next == after {
			t.Fatalf("List: cursor %q does not move on", after)
		}
		after = p.Next
	}
	t.Fatalf("List: more pages than jobs: %v", ids)
	return nil
}

// checkJSON: a job read from a row holding any time encodes to JSON (the
// dashboard's API writes it so; time.Time refuses years past 9999).
func checkJSON(t *testing.T, j *ledger.Job) {
	t.Helper()
	if _, err := json.Marshal(j); err != nil {
		t.Errorf("job %s as JSON: %v", j.MessageID, err)
	}
}

// TestStoreReadsAnyTime: the ledger's own table may hold any time
// PostgreSQL holds, written by hand or by another tool: 'infinity',
// '-infinity', before 1970, years BC or past 9999, in its columns and, once
// an event moves such a row on, in its history. Job and List read them all
// (they failed with a scan error, failing berth jobs and the dashboard),
// 'infinity' as ledger.Infinity, '-infinity' as ledger.NegativeInfinity;
// and List's cursor pages through rows first seen at any of them, each once.
func TestStoreReadsAnyTime(t *testing.T) {
	pool, s, ctx := setup(t)
	now := time.Now()
	firstSeen := map[string]string{
		"inf":     "infinity",
		"neginf":  "-infinity",
		"pre1970": "1900-01-01 00:00:00.5+00",
		"bc":      "0044-03-15 12:00:00+00 BC",
		"far":     "12000-01-01 00:00:00+00",
		"now":     "",
	}
	var events []ledger.Event
	for id := range firstSeen {
		events = append(events,
			ledger.Event{MessageID: id, Queue: "anytime", Type: "t", Status: ledger.StatusRunning, Attempt: 1, At: now, StartedAt: now},
			ledger.Event{MessageID: id, Queue: "anytime", Type: "t", Status: ledger.StatusRetrying, Attempt: 1, At: now,
				Error: "boom", Class: sdk.ClassTransient, NextAttemptAt: now.Add(time.Minute)})
	}
	if err := s.Write(ctx, events); err != nil {
		t.Fatal(err)
	}
	// The "inf" job's attempt 1 holds extreme times; attempt 2's event
	// files them in the history as PostgreSQL's jsonb writes them.
	if _, err := pool.Exec(ctx, `UPDATE `+s.Table()+` SET next_attempt_at = 'infinity', started_at = '0044-03-15 12:00:00+00 BC',
		finished_at = '12000-01-01 00:00:00+00', updated_at = '-infinity' WHERE message_id = 'inf'`); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, []ledger.Event{{MessageID: "inf", Queue: "anytime", Type: "t", Status: ledger.StatusRunning, Attempt: 2,
		At: now.Add(time.Second), StartedAt: now.Add(time.Second)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+s.Table()+` SET next_attempt_at = '-infinity', updated_at = 'infinity' WHERE message_id = 'inf'`); err != nil {
		t.Fatal(err)
	}
	setFirstSeen(t, ctx, pool, s, firstSeen)
	j, err := s.Job(ctx, "inf")
	if err != nil {
		t.Fatalf("Job of a row holding infinity: %v", err)
	}
	checkJSON(t, j)
	if !j.FirstSeenAt.Equal(ledger.Infinity) || !j.UpdatedAt.Equal(ledger.Infinity) || !j.NextAttemptAt.Equal(ledger.NegativeInfinity) {
		t.Errorf("first seen %s, updated %s, next attempt %s; want infinity, infinity, -infinity", j.FirstSeenAt, j.UpdatedAt, j.NextAttemptAt)
	}
	if len(j.History) != 2 {
		t.Fatalf("history %+v; want attempts 1 and 2", j.History)
	}
	if a := j.History[0]; !a.StartedAt.Equal(ledger.NegativeInfinity) || !a.FinishedAt.Equal(ledger.Infinity) ||
		!a.NextAttemptAt.Equal(ledger.Infinity) {
		t.Errorf("attempt 1 started %s, finished %s, next %s; want -infinity (44 BC), infinity (year 12000), infinity",
			a.StartedAt, a.FinishedAt, a.NextAttemptAt)
	}
	for id, fs := range map[string]time.Time{"neginf": ledger.NegativeInfinity, "pre1970": time.Date(1900, 1, 1, 0, 0, 0, 5e8, time.UTC),
		"bc": ledger.NegativeInfinity, "far": ledger.Infinity} {
		j, err := s.Job(ctx, id)
		if err != nil {
			t.Errorf("Job %s: %v", id, err)
			continue
		}
		checkJSON(t, j)
		if !j.FirstSeenAt.Equal(fs) {
			t.Errorf("job %s first seen %s; want %s", id, j.FirstSeenAt, fs)
		}
	}
	ids := listAll(t, ctx, s, "anytime")
	want := []string{"inf", "far", "now", "pre1970", "bc", "neginf"}
	if len(ids) != len(want) {
		t.Fatalf("List pages show %v; want %v, each once", ids, want)
	}
	for i := range want {
		if ids[i] != want[i] {
			t.Fatalf("List pages show %v; want %v", ids, want)
		}
	}
}

// TestJobsReadsAnyTime: the same on the PostgreSQL broker's jobs table,
// whose available_at, created_at and updated_at another tool may set to
// any time PostgreSQL holds.
func TestJobsReadsAnyTime(t *testing.T) {
	ctx, pool, b, schema := jobsBroker(t)
	var ids []string
	for range 4 {
		m := &sdk.Message{Type: "t", Body: []byte(`{}`)}
		if err := b.Publish(ctx, "anytime", m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}
	set := []string{
		`status = 'retry', available_at = 'infinity', created_at = '-infinity', updated_at = 'infinity'`,
		`status = 'queued', available_at = 'infinity', created_at = '1900-01-01 00:00:00+00', updated_at = '-infinity'`,
		`status = 'dead_letter', available_at = '-infinity', created_at = '12000-01-01 00:00:00+00', updated_at = '0044-03-15 00:00:00+00 BC'`,
	}
	for i, s := range set {
		if _, err := pool.Exec(ctx, `UPDATE `+schema+`.jobs SET `+s+` WHERE message_id = $1`, ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	r, err := pgledger.NewJobs(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ next, first, updated time.Time }{
		{ledger.Infinity, ledger.NegativeInfinity, ledger.Infinity},
		{ledger.Infinity, time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC), ledger.NegativeInfinity},
		{time.Time{}, ledger.Infinity, ledger.NegativeInfinity},
	}
	for i, w := range want {
		j, err := r.Job(ctx, ids[i])
		if err != nil {
			t.Errorf("Job of row %d: %v", i, err)
			continue
		}
		checkJSON(t, j)
		if !j.NextAttemptAt.Equal(w.next) || !j.FirstSeenAt.Equal(w.first) || !j.UpdatedAt.Equal(w.updated) {
			t.Errorf("row %d: next %s, first seen %s, updated %s; want %s, %s, %s", i, j.NextAttemptAt, j.FirstSeenAt, j.UpdatedAt,
				w.next, w.first, w.updated)
		}
	}
	if got := listAll(t, ctx, r, "anytime"); len(got) != len(ids) {
		t.Errorf("List pages show %v; want the %d jobs", got, len(ids))
	}
}

// setFirstSeen sets the first_seen_at of each job of firstSeen (by message
// ID) to the time it maps to, in PostgreSQL's text ('infinity' and far
// times included, which no Go time.Time writes); "" leaves one as it is.
func setFirstSeen(t *testing.T, ctx context.Context, pool *pgxpool.Pool, s *pgledger.Store, firstSeen map[string]string) {
	t.Helper()
	for id, fs := range firstSeen {
		if fs == "" {
			continue
		}
		if _, err := pool.Exec(ctx, `UPDATE `+s.Table()+` SET first_seen_at = $2::timestamptz WHERE message_id = $1`, id, fs); err != nil {
			t.Fatal(err)
		}
	}
}
