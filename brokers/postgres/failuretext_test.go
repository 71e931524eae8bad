package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestFailureTimesOneText: one instant reads as one header string whichever
// path wrote it, as sdk.AnnotateDeadLetter writes it (time.RFC3339Nano: no
// trailing zeros in the fraction). The claim's SQL wrote six fractional
// digits, DeadLetter's Go code trimmed them, so the same first_failure_at
// read "…05.500000Z" on a job the claim dead-lettered past max_attempts
// and "…05.5Z" on one DeadLetter moved, and a dead letter's first and last
// failure could differ in form.
func TestFailureTimesOneText(t *testing.T) {
	pool := newPool(t, "berth-failuretext-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{MaxAttempts: 3, Lease: time.Minute, PollInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	q := "failuretext_" + suffix()
	const firstAt, want = "2026-01-02 03:04:05.5+00", "2026-01-02T03:04:05.5Z"
	var ids [2]string
	for i := range ids {
		m := &sdk.Message{Body: []byte("x")}
		if err := b.Publish(ctx, q, m); err != nil {
			t.Fatal(err)
		}
		ids[i] = m.ID
	}
	// Job 0 has used up its attempts: the claim dead-letters it in SQL.
	// Job 1 failed before too: it is claimed, then dead-lettered by DeadLetter.
	if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET first_failure_at = $2::timestamptz, status = 'retry',
		attempt_count = CASE WHEN message_id = $1 THEN max_attempts ELSE 1 END`, ids[0], firstAt); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]
	if d.Message().ID != ids[1] {
		t.Fatalf("received %s; want %s", d.Message().ID, ids[1])
	}
	if err := d.DeadLetter(ctx, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		var status, first, last string
		if err := pool.QueryRow(ctx, `SELECT status, headers->>$2, headers->>$3 FROM `+b.Schema()+`.jobs WHERE message_id = $1`,
			id, sdk.HeaderFirstFailure, sdk.HeaderLastFailure).Scan(&status, &first, &last); err != nil {
			t.Fatal(err)
		}
		if status != "dead_letter" {
			t.Fatalf("job %d: status %s", i, status)
		}
		if first != want {
			t.Errorf("job %d: first failure %q; want %q", i, first, want)
		}
		at, err := time.Parse(time.RFC3339Nano, last)
		if err != nil {
			t.Fatalf("job %d: last failure %q: %v", i, last, err)
		}
		if canon := at.UTC().Format(time.RFC3339Nano); last != canon {
			t.Errorf("job %d: last failure %q; time.RFC3339Nano writes it %q", i, last, canon)
		}
	}
	// A whole second has no fraction at all.
	var whole string
	if err := pool.QueryRow(ctx, `SELECT `+postgres.RFC3339SQL("'2026-01-02 03:04:05+00'::timestamptz")).Scan(&whole); err != nil {
		t.Fatal(err)
	}
	if whole != "2026-01-02T03:04:05Z" {
		t.Errorf("a whole second reads %q", whole)
	}
}

// TestDeadLetterForeignFirstFailureOnServerClock: a job that never failed
// before, carrying a berth-first-failure from outside berth that is no
// first failure (garbage, a time to come), is dead-lettered with its first
// failure on the database server's clock, as its last: the statement's
// now() for both. DeadLetter counted any such header as a first failure
// already known, so AnnotateDeadLetter's replacement — the application
// host's clock — stayed in the header, and a host clock ahead of the
// server's put the first failure after the last.
func TestDeadLetterForeignFirstFailureOnServerClock(t *testing.T) {
	pool := newPool(t, "berth-foreignfirst-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{Lease: time.Minute, PollInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	q := "foreignfirst_" + suffix()
	for _, v := range []string{"garbage", "<script>", "2999-01-01T00:00:00Z"} {
		// Publish refuses berth- headers: another tool writes the row.
		m := &sdk.Message{Body: []byte("x")}
		if err := b.Publish(ctx, q, m); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET headers = COALESCE(headers, '{}'::jsonb) || jsonb_build_object($2::text, $3::text) WHERE message_id = $1`,
			m.ID, sdk.HeaderFirstFailure, v); err != nil {
			t.Fatal(err)
		}
		d := receiveN(t, b, q, 1)[0]
		if err := d.DeadLetter(ctx, errors.New("boom")); err != nil {
			t.Fatal(err)
		}
		var first, last string
		var column time.Time
		if err := pool.QueryRow(ctx, `SELECT headers->>$2, headers->>$3, first_failure_at FROM `+b.Schema()+`.jobs WHERE message_id = $1`,
			m.ID, sdk.HeaderFirstFailure, sdk.HeaderLastFailure).Scan(&first, &last, &column); err != nil {
			t.Fatal(err)
		}
		if first != last {
			t.Errorf("header %q: first failure %q, last %q; want both the statement's now()", v, first, last)
		}
		if want := column.UTC().Format(time.RFC3339Nano); first != want {
			t.Errorf("header %q: first failure %q; want first_failure_at %q", v, first, want)
		}
	}
}
