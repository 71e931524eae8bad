package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/berthq/berth/sdk"
)

// TestJobsShowAnyTime: a row of the PostgreSQL broker's jobs table that
// another tool wrote with 'infinity', '-infinity' or a year past 9999 (all
// of which PostgreSQL allows) failed berth jobs and berth job show with a
// scan error, and -json could not write a year past 9999. They show as
// "infinity" and "-infinity" now, and -json writes the times
// ledger.Infinity and ledger.NegativeInfinity stand for them.
func TestJobsShowAnyTime(t *testing.T) {
	ctx := context.Background()
	pool, b, u := pgSchema(t, false)
	m := &sdk.Message{Type: "t", Body: []byte(`{}`)}
	if err := b.Publish(ctx, "anytime", m); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET status = 'retry', available_at = 'infinity',
		created_at = '-infinity', updated_at = '12000-01-01 00:00:00+00' WHERE message_id = $1`, m.ID); err != nil {
		t.Fatal(err)
	}
	r := cliOn(t, u, "job", "show", m.ID)
	if r.code != exitOK || !strings.Contains(r.out, "next attempt:    infinity\n") || !strings.Contains(r.out, "first seen:      -infinity\n") ||
		!strings.Contains(r.out, "updated:         infinity\n") {
		t.Errorf("job show: exit %d\n%s%s", r.code, r.out, r.err)
	}
	r = cliOn(t, u, "job", "show", m.ID, "-json")
	var j jsonJob
	if err := json.Unmarshal([]byte(r.out), &j); err != nil || r.code != exitOK || j.NextAttemptAt == nil || j.NextAttemptAt.Year() != 9999 ||
		j.FirstSeenAt == nil || j.FirstSeenAt.Year() != 0 {
		t.Errorf("job show -json: exit %d, %+v, %v\n%s%s", r.code, j, err, r.out, r.err)
	}
	r = cliOn(t, u, "jobs", "-queue", "anytime")
	if r.code != exitOK || !strings.Contains(r.out, "infinity") || !strings.Contains(r.out, "1 job(s) shown") {
		t.Errorf("jobs: exit %d\n%s%s", r.code, r.out, r.err)
	}
	r = cliOn(t, u, "jobs", "-queue", "anytime", "-json")
	var v jsonJobs
	if err := json.Unmarshal([]byte(r.out), &v); err != nil || r.code != exitOK || len(v.Jobs) != 1 {
		t.Errorf("jobs -json: exit %d, %v\n%s%s", r.code, err, r.out, r.err)
	}
}
