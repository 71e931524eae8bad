package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestConfirmedChangeReportsMissingIDs: a change by IDs confirmed on a
// terminal is capped at the count confirmed (o.Limit), and applyIDs stopped
// looking IDs up once that many had matched: a named ID that is not a dead
// letter, after the ones that are, was never looked up, so the change
// neither named it nor exited 4, as README.md says a change does ("A named
// ID that is not a dead letter makes a change or a -dry-run exit 4"), and
// as the same change with -yes does. Now it is named, and the exit is 4.
// A -dry-run with -limit stopped the same way, and exited 0 for the
// change that would exit 4.
func TestConfirmedChangeReportsMissingIDs(t *testing.T) {
	for _, verb := range []string{"redrive", "purge"} {
		b, ids := deadLettered(t, 3)
		e := env{interactive: true, stdin: strings.NewReader("y\n")}
		r := berthEnv(t, context.Background(), b, e, "-json", "dlq", verb, "billing", ids[0], "no-such-id")
		var rep jsonChange
		if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
			t.Fatalf("%s: %v:\n%s%s", verb, err, r.out, r.err)
		}
		if r.code != exitPartial || rep.Done != 1 || rep.Missed != 1 || len(rep.Failed) != 1 || rep.Failed[0].ID != "no-such-id" {
			t.Errorf("confirmed %s of a dead letter and a missing ID: exit %d, %+v; want exit 4, done 1, missed 1 naming no-such-id\n%s",
				verb, r.code, rep, r.err)
		}
		if st := stats(t, b); st.DeadLettered != 2 {
			t.Errorf("confirmed %s: %d dead letters left, want 2", verb, st.DeadLettered)
		}
	}
	b, ids := deadLettered(t, 3)
	r := berth(t, b, "dlq", "purge", "billing", ids[0], "no-such-id", "-limit", "1", "-dry-run")
	if r.code != exitPartial || !strings.Contains(r.out, "not a dead letter of billing: no-such-id") {
		t.Errorf("dry run -limit 1 of a dead letter and a missing ID: exit %d, want 4 naming no-such-id:\n%s%s", r.code, r.out, r.err)
	}
}
