package main

import (
	"context"
	"strings"
	"testing"
)

// TestConfirmOfACappedScan: a change asked on a terminal counts the chosen
// dead letters first; when that scan was capped (-scan-limit) and none of
// the letters read matched, it said "no dead letter of billing matches"
// and exited 3, where a dry run and dlq list exit 4 (more may match past
// the cap). It now exits 4 saying so, changing nothing; a capped count to
// confirm says it is the count found, not all that match.
func TestConfirmOfACappedScan(t *testing.T) {
	b, _ := deadLettered(t, 6)
	ctx := context.Background()
	for _, verb := range []string{"redrive", "purge"} {
		e := onUnpaged(b)
		e.interactive, e.stdin = true, strings.NewReader("y\n")
		r := berthEnv(t, ctx, b, e, "dlq", verb, "billing", "-type", "no.such.type", "-scan-limit", "3")
		if r.code != exitPartial || !strings.Contains(r.err, "none of the dead letters read matches, but the scan stopped before the end") ||
			!strings.Contains(r.err, "raise -scan-limit (it was 3)") || strings.Contains(r.err, "[y/N]") {
			t.Fatalf("capped %s matching none, on a terminal (exit %d):\n%s%s", verb, r.code, r.out, r.err)
		}
		e.stdin = strings.NewReader("n\n")
		r = berthEnv(t, ctx, b, e, "dlq", verb, "billing", "-reason", "/./", "-scan-limit", "3")
		if !strings.Contains(r.err, "the 3 found (the scan stopped before the end of the dead-letter queue: more may match) dead letter(s) of billing") {
			t.Fatalf("capped %s question (exit %d):\n%s%s", verb, r.code, r.out, r.err)
		}
	}
	if st := stats(t, b); st.DeadLettered != 6 {
		t.Fatalf("nothing was to change: %+v", st)
	}
}
