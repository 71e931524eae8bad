package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestPoisonFirstFailureHeaderAsAnnotate: a job the claim dead-letters past
// max_attempts whose row has no first_failure_at takes the
// berth-first-failure header already on the row (written by hand or by
// another tool: it may be forged) as sdk.AnnotateDeadLetter does on every
// other path: kept only when it is an RFC 3339 time not after now, in UTC,
// else now. The claim used to keep whatever the header said: garbage, or a
// first failure after the last.
func TestPoisonFirstFailureHeaderAsAnnotate(t *testing.T) {
	pool := newPool(t, "berth-poisonheader-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{MaxAttempts: 2, Lease: time.Minute, PollInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	q := "poisonheader_" + suffix()
	cases := []struct {
		header string
		kept   bool // AnnotateDeadLetter keeps it (checked below as well)
	}{
		{"not a time", false},
		{"", false},
		{"2001-02-03", false},
		{"2999-01-01T00:00:00Z", false}, // after now: a first failure after the last
		{"2001-02-03T04:05:06Z", true},
		{"2001-02-03T04:05:06.5+02:30", true},
		{"2020-02-29T23:30:00.123456789-01:00", true},
		{"2020-02-29T23:30:00,25Z", true},
		{"2001-02-03T04:05:06+24:60", true},
		{"2001-02-03T04:05:06+25:00", false},
		{"2001-02-03T04:05:06+23:61", false},
		{"2021-02-29T00:00:00Z", false},
		{"2001-04-31T00:00:00Z", false},
		{"2001-13-01T00:00:00Z", false},
		{"2001-01-01T24:00:00Z", false},
		{"2001-01-01T00:60:00Z", false},
		{"2001-01-01T00:00:60Z", false},
		{"2001-01-01t00:00:00z", false},
		{"2001-01-01 00:00:00Z", false},
		{"2001-01-01T00:00:00", false},
		{" 2001-01-01T00:00:00Z", false},
	}
	ids := make([]string, len(cases))
	for i, c := range cases {
		m := &sdk.Message{Body: []byte("x")}
		if err := b.Publish(ctx, q, m); err != nil {
			t.Fatal(err)
		}
		ids[i] = m.ID
		// As a row another tool wrote: attempts used up, no first failure
		// of the broker's own, a header of the tool's.
		if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET headers = jsonb_build_object($2::text, $3::text),
			attempt_count = max_attempts, first_failure_at = NULL WHERE message_id = $1`,
			m.ID, sdk.HeaderFirstFailure, c.header); err != nil {
			t.Fatal(err)
		}
	}
	for {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+b.Schema()+`.jobs WHERE queue = $1 AND status <> 'dead_letter'`, q).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		ds, err := b.Receive(short, q, len(cases))
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Receive of jobs past max attempts: %d deliveries, %v; want none", len(ds), err)
		}
		if ctx.Err() != nil {
			t.Fatalf("%d jobs not dead-lettered", left)
		}
	}
	for i, c := range cases {
		var first, last string
		if err := pool.QueryRow(ctx, `SELECT headers->>$2, headers->>$3 FROM `+b.Schema()+`.jobs WHERE message_id = $1`,
			ids[i], sdk.HeaderFirstFailure, sdk.HeaderLastFailure).Scan(&first, &last); err != nil {
			t.Fatal(err)
		}
		lastAt, err := time.Parse(time.RFC3339Nano, last)
		if err != nil {
			t.Fatalf("%q: last failure %q: %v", c.header, last, err)
		}
		firstAt, err := time.Parse(time.RFC3339Nano, first)
		if err != nil {
			t.Errorf("%q: first failure %q is not an RFC 3339 time: %v", c.header, first, err)
			continue
		}
		// What AnnotateDeadLetter makes of the header at the same now.
		m := &sdk.Message{Headers: map[string]string{sdk.HeaderFirstFailure: c.header}}
		sdk.AnnotateDeadLetter(m, q, 2, sdk.ErrMaxDeliveries, time.Time{}, lastAt)
		want, err := time.Parse(time.RFC3339Nano, m.Header(sdk.HeaderFirstFailure))
		if err != nil {
			t.Fatal(err)
		}
		if kept := !want.Equal(lastAt); kept != c.kept {
			t.Fatalf("%q: AnnotateDeadLetter kept it: %v; the case says %v", c.header, kept, c.kept)
		}
		if !firstAt.Equal(want.Truncate(time.Microsecond)) || firstAt.Location() != time.UTC {
			t.Errorf("%q: first failure %q; AnnotateDeadLetter gives %q (to the microsecond, in UTC)",
				c.header, first, m.Header(sdk.HeaderFirstFailure))
		}
	}
}
