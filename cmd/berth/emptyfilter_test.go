package main

import (
	"strings"
	"testing"
)

// TestEmptyFilterIsRefused: a filter flag given an empty value (-type "",
// -type ",", -class "", -reason "", -reason "//" (-reason "/$RE/" with RE
// unset: an empty regexp matches every reason): a script's unset variable, as in
// berth dlq purge billing -type "$TYPE" -yes) chose no narrower set but
// every dead letter, and the purge deleted them all. An empty filter is
// now a usage error (exit 2), refused before anything is read; leaving
// the flag out still chooses every dead letter.
func TestEmptyFilterIsRefused(t *testing.T) {
	for _, flags := range [][]string{{"-type", ""}, {"-type", " , "}, {"-class", ""}, {"-reason", ""}, {"-reason", "//"}} {
		for _, verb := range []string{"purge", "redrive"} {
			b, _ := deadLettered(t, 4)
			args := append([]string{"dlq", verb, "billing", "-yes"}, flags...)
			r := berth(t, b, args...)
			if st := stats(t, b); st.DeadLettered != 4 || r.code != exitUsage || !strings.Contains(r.err, flags[0]+" is empty") {
				t.Fatalf("berth %q: exit %d, %d of 4 dead letters left:\n%s%s", args, r.code, st.DeadLettered, r.out, r.err)
			}
		}
		b, _ := deadLettered(t, 4)
		if r := berth(t, b, append([]string{"dlq", "list", "billing"}, flags...)...); r.code != exitUsage {
			t.Fatalf("dlq list %q: exit %d:\n%s%s", flags, r.code, r.out, r.err)
		}
	}
}
