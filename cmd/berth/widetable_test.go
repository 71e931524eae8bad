package main

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// forgedID is a 200 KB message ID with a terminal escape in it, and
// forgedCell the cell a table shows for it: escaped, then cut at idWidth
// runes between whole escapes, with a visible "…".
var (
	forgedID   = "forged\x1b[2J" + strings.Repeat("é", 100<<10)
	forgedCell = `forged\x1b[2J` + strings.Repeat("é", idWidth-1-len(`forged\x1b[2J`)) + "…"
)

// checkTable checks the table of rows rows at the start of out: its
// second column starts at the same rune in the header and every row (the
// table is aligned), and no line is wider than its columns' bounds.
func checkTable(t *testing.T, out string, rows int) {
	t.Helper()
	lines := strings.Split(out, "\n")
	if len(lines) < rows+1 {
		t.Fatalf("want a header and %d rows:\n%.2000s", rows, out)
	}
	second := func(l string) int { // the rune where the second cell starts
		i := strings.Index(l, "  ")
		if i < 0 {
			return -1
		}
		j := i + len(l[i:]) - len(strings.TrimLeft(l[i:], " "))
		return utf8.RuneCountInString(l[:j])
	}
	want := second(lines[0])
	for _, l := range lines[:rows+1] {
		if n := utf8.RuneCountInString(l); n > 400 {
			t.Errorf("a line of the table is %d runes wide, want at most 400: %.200q…", n, l)
		}
		if got := second(l); got != want {
			t.Errorf("the second column starts at rune %d of %.200q, at %d in the header: the table is not aligned", got, l, want)
		}
	}
}

// TestTablesCutLongIDs: a dead letter whose forged ID is 200 KB long. A
// table pads every row to its widest cell, and the ID was printed whole:
// before, every row of dlq list and of a dry run was 200 KB wide. The ID
// column is cut at idWidth runes like the dashboard's, after escaping, with
// a note saying so; -json and dlq show still give the ID whole.
func TestTablesCutLongIDs(t *testing.T) {
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	for _, id := range []string{"plain-1", forgedID, "plain-2"} {
		if err := b.Publish(ctx, "billing", &sdk.Message{ID: id, Type: "billing.charge", Body: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Receive(ctx, "billing", 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("receive: %d %v", len(ds), err)
		}
		if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("declined"))); err != nil {
			t.Fatal(err)
		}
	}

	for _, args := range [][]string{{"dlq", "list", "billing"}, {"dlq", "redrive", "billing", "-dry-run"}} {
		r := berth(t, b, args...)
		if r.code != exitOK {
			t.Fatalf("%v: exit %d\n%.2000s%s", args, r.code, r.out, r.err)
		}
		if len(r.out) > 4<<10 {
			t.Errorf("%v prints %d bytes for 3 dead letters", args, len(r.out))
		}
		checkTable(t, r.out, 3)
		if !strings.Contains(r.out, "\n"+forgedCell+"  ") || !strings.Contains(r.out, "\nplain-1  ") {
			t.Errorf("%v: no row starts with %q:\n%.2000s", args, forgedCell, r.out)
		}
		if !strings.Contains(r.out, cutIDsNote) {
			t.Errorf("%v: no note that an ID was cut:\n%.2000s", args, r.out)
		}
		if strings.Contains(r.out, "\x1b") {
			t.Errorf("%v: a raw ESC in the output", args)
		}
	}
	// Uncut, no note.
	if r := berth(t, b, "dlq", "list", "billing", "-limit", "1"); r.code != exitOK || strings.Contains(r.out, cutIDsNote) {
		t.Errorf("list of a short ID (exit %d) notes a cut:\n%s", r.code, r.out)
	}

	// The whole ID stays reachable: -json, and dlq show by it.
	r := berth(t, b, "-json", "dlq", "list", "billing")
	var l jsonList
	if err := json.Unmarshal([]byte(r.out), &l); err != nil || len(l.Messages) != 3 {
		t.Fatalf("list -json: exit %d, %v", r.code, err)
	}
	if !slices.ContainsFunc(l.Messages, func(m dlq.Message) bool { return m.ID == forgedID }) {
		t.Errorf("list -json does not give the whole ID")
	}
	r = berth(t, b, "dlq", "show", "billing", forgedID)
	if r.code != exitOK || !strings.Contains(r.out, "id:              "+esc(forgedID)+"\n") {
		t.Errorf("dlq show (exit %d) does not show the whole ID:\n%.500s", r.code, r.out)
	}
}

// TestJobsTableCutsLongIDs: berth jobs printed each job's ID whole, so one
// forged 200 KB ID padded every row of the listing to 200 KB. It is cut as
// in dlq list; -json and job show keep it whole. Publish refuses an ID that
// long (postgres.MaxIndexedLength): the forged one is written into the jobs
// table directly, as a producer outside berth can.
func TestJobsTableCutsLongIDs(t *testing.T) {
	ctx := context.Background()
	pool, b, u := pgSchema(t, false)
	for _, id := range []string{"plain-1", "forged-placeholder", "plain-2"} {
		if err := b.Publish(ctx, "billing", &sdk.Message{ID: id, Type: "billing.charge", Body: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{b.Schema(), "jobs"}.Sanitize()+` SET message_id = $1 WHERE message_id = 'forged-placeholder'`, forgedID); err != nil {
		t.Fatal(err)
	}
	r := cliOn(t, u, "jobs", "-queue", "billing")
	if r.code != exitOK {
		t.Fatalf("jobs: exit %d\n%.2000s%s", r.code, r.out, r.err)
	}
	if len(r.out) > 4<<10 {
		t.Errorf("jobs prints %d bytes for 3 jobs", len(r.out))
	}
	checkTable(t, r.out, 3)
	if !strings.Contains(r.out, "\n"+forgedCell+"  ") || !strings.Contains(r.out, cutIDsNote) {
		t.Errorf("jobs: no row starts with %q, or no note of the cut:\n%.2000s", forgedCell, r.out)
	}
	r = cliOn(t, u, "-json", "jobs", "-queue", "billing")
	var v jsonJobs
	if err := json.Unmarshal([]byte(r.out), &v); err != nil || r.code != exitOK {
		t.Fatalf("jobs -json: exit %d, %v", r.code, err)
	}
	if !slices.ContainsFunc(v.Jobs, func(j jsonJob) bool { return j.ID == forgedID }) {
		t.Errorf("jobs -json does not give the whole ID")
	}
	if r := cliOn(t, u, "job", "show", forgedID); r.code != exitOK || !strings.Contains(r.out, esc(forgedID)+"\n") {
		t.Errorf("job show (exit %d) does not show the whole ID:\n%.500s%s", r.code, r.out, r.err)
	}
}
