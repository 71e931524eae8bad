package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"
)

// TestDryRunJSONNamesARawMissingIDExactly: a dry run's "failed" lists the
// named IDs that are not dead letters; README.md ("Operating berth")
// promises each an "id_base64", as in dlq show, when the ID is not UTF-8
// (an AMQP message-id is bytes; an operator passes it as $'\xff…').
// Before, the dry run wrote only "id", in which encoding/json had replaced
// the invalid bytes with U+FFFD: a script could not tell which ID it was,
// while the change itself (failures) gave id_base64.
func TestDryRunJSONNamesARawMissingIDExactly(t *testing.T) {
	b, ids := deadLettered(t, 2)
	const raw = "job-\xff\xfe-1"
	for _, verb := range []string{"redrive", "purge"} {
		r := berthEnv(t, context.Background(), b, env{}, "-json", "dlq", verb, "billing", ids[0], raw, "-dry-run")
		var rep jsonChange
		if err := json.Unmarshal([]byte(r.out), &rep); err != nil || r.code != exitPartial || len(rep.Failed) != 1 {
			t.Fatalf("%s dry run (exit %d, %v):\n%s%s", verb, r.code, err, r.out, r.err)
		}
		if got, want := rep.Failed[0].IDBase64, base64.StdEncoding.EncodeToString([]byte(raw)); got != want {
			t.Errorf("%s dry run: failed[0].id_base64 = %q, want %q (the ID's exact bytes)", verb, got, want)
		}
	}
	if st := stats(t, b); st.DeadLettered != 2 {
		t.Fatalf("a dry run changed something: %+v", st)
	}
}
