package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// missingLines returns the lines of out that name an ID as not a dead
// letter, or say how many more are not.
func missingLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "not a dead letter of ") || strings.HasPrefix(l, "… and ") {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestConfirmNamesMissingIDsWhenNoneMatch: a change by IDs on a terminal
// (no -yes) whose named IDs are none of them dead letters exited 3 with
// "no dead letter of billing matches" and did not name them, while -yes
// and -dry-run do. It names them as a dry run does (the first
// dlq.MaxFailures, then how many more), in -json the report as -yes
// writes it, and asks nothing.
func TestConfirmNamesMissingIDsWhenNoneMatch(t *testing.T) {
	for _, verb := range []string{"redrive", "purge"} {
		b, _ := deadLettered(t, 2)
		args := []string{"dlq", verb, "billing"}
		for i := range 150 {
			args = append(args, fmt.Sprintf("nope-%03d", i))
		}
		e := env{interactive: true, stdin: strings.NewReader("y\n")}
		r := berthEnv(t, context.Background(), b, e, args...)
		got := missingLines(r.out)
		if r.code != exitNotFound || len(got) != 101 || got[0] != "not a dead letter of billing: nope-000" ||
			got[99] != "not a dead letter of billing: nope-099" || got[100] != "… and 50 more not dead letters of billing" {
			t.Errorf("%s on a terminal of 150 IDs none of which is a dead letter: exit %d, %d lines naming them; want exit 3, "+
				"the first 100 named and \"… and 50 more\"\n%s%s", verb, r.code, len(got), r.out, r.err)
		}
		if strings.Contains(r.err, "[y/N]") {
			t.Errorf("%s: asked to confirm a change of nothing:\n%s", verb, r.err)
		}
		dry := berth(t, b, append(args, "-dry-run")...)
		if want := missingLines(dry.out); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: the confirmation path names\n%v\nthe dry run\n%v", verb, got, want)
		}
		r = berthEnv(t, context.Background(), b, e, append([]string{"-json"}, args...)...)
		var rep jsonChange
		if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
			t.Fatalf("%s -json: %v:\n%s%s", verb, err, r.out, r.err)
		}
		if r.code != exitNotFound || rep.Matched != 0 || rep.Done != 0 || rep.Missed != 150 || len(rep.Failed) != 150 || rep.Failed[0].ID != "nope-000" {
			t.Errorf("%s -json on a terminal: exit %d, %+v; want exit 3 and a report missing the 150 IDs", verb, r.code, rep)
		}
		if st := stats(t, b); st.DeadLettered != 2 {
			t.Errorf("%s: %d dead letters left, want 2", verb, st.DeadLettered)
		}
	}
}
