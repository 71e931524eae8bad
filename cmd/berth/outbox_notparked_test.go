package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestOutboxRequeueNamesRowsNotParked: outbox requeue given ids that are
// not parked rows (absent, or pending: requeued already) requeues the
// parked ones and names the others, as dlq redrive names IDs that are not
// dead letters: each on a line (at most 100, then "… and N more"), exit 4,
// or 3 when none of them is parked. The dry run answers as the change
// would. It refused the whole command (3) naming none of them with -yes,
// and with an unbounded list after a confirmation.
func TestOutboxRequeueNamesRowsNotParked(t *testing.T) {
	box, dsn, table := parkedOutbox(t, 3)
	ctx := context.Background()
	rows, err := box.Parked(ctx, 0)
	if err != nil || len(rows) != 3 {
		t.Fatalf("parked %d %v", len(rows), err)
	}
	p0, p1, p2 := fmt.Sprint(rows[0].ID), fmt.Sprint(rows[1].ID), fmt.Sprint(rows[2].ID)
	parked := func(id string) bool {
		t.Helper()
		rs, err := box.Parked(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if fmt.Sprint(r.ID) == id {
				return true
			}
		}
		return false
	}
	db := []string{"-db", dsn, "-table", table}

	r := cliDB(t, "", false, append([]string{"outbox", "requeue", p0, "999999", "-dry-run"}, db...)...)
	if r.code != exitPartial || !strings.Contains(r.out, "would requeue 1 parked row(s)") || !strings.Contains(r.out, "not a parked row: 999999") || !parked(p0) {
		t.Errorf("dry run: exit %d, want %d, naming 999999, nothing changed:\n%s%s", r.code, exitPartial, r.out, r.err)
	}
	r = cliDB(t, "", false, append([]string{"outbox", "requeue", "999998", "999999", "-yes"}, db...)...)
	if r.code != exitNotFound || !strings.Contains(r.out, "not requeued: 999998: ") || !strings.Contains(r.out, "not requeued: 999999: ") {
		t.Errorf("none parked: exit %d, want %d, naming both:\n%s%s", r.code, exitNotFound, r.out, r.err)
	}
	r = cliDB(t, "y\n", true, append([]string{"outbox", "requeue", p0, "999999"}, db...)...)
	if r.code != exitPartial || !strings.Contains(r.out, "requeued 1 parked row(s)") || !strings.Contains(r.out, "not requeued: 999999: ") || parked(p0) {
		t.Errorf("confirmed: exit %d, want %d, %s requeued and 999999 named:\n%s%s", r.code, exitPartial, p0, r.out, r.err)
	}
	// p0 is pending now: not parked either.
	r = cliDB(t, "", false, append([]string{"outbox", "requeue", p0, p1, "999999", "-yes", "-json"}, db...)...)
	var v struct {
		Done   int `json:"done"`
		Missed int `json:"missed"`
		Failed []struct {
			ID    int64  `json:"id"`
			Error string `json:"error"`
		} `json:"failed"`
	}
	if err := json.Unmarshal([]byte(r.out), &v); err != nil || r.code != exitPartial || v.Done != 1 || v.Missed != 2 || len(v.Failed) != 2 ||
		fmt.Sprint(v.Failed[0].ID) != p0 || v.Failed[1].ID != 999999 || parked(p1) {
		t.Errorf("-yes -json: exit %d, %+v (%v), want 4, done 1, %s and 999999 failed:\n%s%s", r.code, v, err, p0, r.out, r.err)
	}
	// Named at most 100, then counted.
	args := []string{"outbox", "requeue", p2, "-yes"}
	for i := range 105 {
		args = append(args, fmt.Sprint(900000+i))
	}
	r = cliDB(t, "", false, append(args, db...)...)
	if n := strings.Count(r.out, "not requeued: "); r.code != exitPartial || n != 100 || !strings.Contains(r.out, "… and 5 more not requeued") || parked(p2) {
		t.Errorf("many: exit %d, %d named; want %d, 100 named and \"… and 5 more\":\n%s%s", r.code, n, exitPartial, r.out, r.err)
	}
	if r = cliDB(t, "", false, "outbox", "requeue", "-h"); !strings.Contains(r.out, "not parked") {
		t.Errorf("help does not say what becomes of ids that are not parked:\n%s", r.out)
	}
}

// TestOutboxDiscardNamesRowsNotParked: a discard (which cannot be undone)
// naming a row that is not parked still changes nothing (exit 3), but
// names the rows that are not, as requeue does.
func TestOutboxDiscardNamesRowsNotParked(t *testing.T) {
	box, dsn, table := parkedOutbox(t, 1)
	rows, _ := box.Parked(context.Background(), 0)
	id := fmt.Sprint(rows[0].ID)
	r := cliDB(t, "", false, "outbox", "discard", id, "999999", "-yes", "-db", dsn, "-table", table)
	if r.code != exitNotFound || !strings.Contains(r.out, "not a parked row: 999999") || !strings.Contains(r.err, "nothing changed") {
		t.Errorf("exit %d, want %d naming 999999, nothing changed:\n%s%s", r.code, exitNotFound, r.out, r.err)
	}
	if left, _ := box.Parked(context.Background(), 0); len(left) != 1 {
		t.Errorf("parked after: %d, want 1", len(left))
	}
}
