package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// unpaged is a memory broker that, like SQS, can neither page nor sweep
// its dead letters: the CLI reads them in one scan of at most -scan-limit.
type unpaged struct {
	sdk.Broker
	sdk.DeadLetters
}

func (unpaged) Close() error { return nil }

func onUnpaged(b *memory.Broker) env {
	return env{open: func(context.Context, string) (sdk.Broker, error) { return unpaged{b, b}, nil }}
}

// A dry run whose scan was capped counted "at least N": like dlq list, it
// exits 4 with a stderr line saying the count is partial (text and -json),
// even when none of the letters read matched; uncapped, it exits 0 (3 when
// nothing matched). Before, a capped dry run exited 0, or 3 when none of the
// first -scan-limit matched, and a script took the count for all of them.
func TestDryRunOfACappedScanIsPartial(t *testing.T) {
	b, _ := deadLettered(t, 6)
	ctx := context.Background()
	partial := func(r result) bool {
		return r.code == exitPartial && strings.Contains(r.err, "the dry run is partial") && strings.Contains(r.err, "raise -scan-limit (it was 3)")
	}
	for _, verb := range []string{"redrive", "purge"} {
		r := berthEnv(t, ctx, b, onUnpaged(b), "dlq", verb, "billing", "-reason", "/./", "-scan-limit", "3", "-dry-run")
		if !partial(r) || !strings.Contains(r.out, "would "+verb+" at least 3 dead letter(s)") {
			t.Fatalf("capped %s dry run (exit %d):\n%s%s", verb, r.code, r.out, r.err)
		}
		r = berthEnv(t, ctx, b, onUnpaged(b), "-json", "dlq", verb, "billing", "-reason", "/./", "-scan-limit", "3", "-dry-run")
		var rep jsonChange
		if !partial(r) || json.Unmarshal([]byte(r.out), &rep) != nil || rep.Complete || rep.Incomplete == "" || rep.Matched != 3 {
			t.Fatalf("capped %s dry run, json (exit %d):\n%s%s", verb, r.code, r.out, r.err)
		}
		// None of the first 3 matches: not "nothing matched".
		r = berthEnv(t, ctx, b, onUnpaged(b), "dlq", verb, "billing", "-type", "no.such.type", "-scan-limit", "3", "-dry-run")
		if !partial(r) {
			t.Fatalf("capped %s dry run matching none (exit %d):\n%s%s", verb, r.code, r.out, r.err)
		}
		// Read to the end: complete.
		r = berthEnv(t, ctx, b, onUnpaged(b), "dlq", verb, "billing", "-reason", "/./", "-dry-run")
		if r.code != exitOK || r.err != "" || !strings.Contains(r.out, "would "+verb+" 6 dead letter(s)") {
			t.Fatalf("uncapped %s dry run (exit %d):\n%s%s", verb, r.code, r.out, r.err)
		}
		r = berthEnv(t, ctx, b, onUnpaged(b), "dlq", verb, "billing", "-type", "no.such.type", "-dry-run")
		if r.code != exitNotFound {
			t.Fatalf("uncapped %s dry run matching none (exit %d):\n%s%s", verb, r.code, r.out, r.err)
		}
	}
	if st := stats(t, b); st.DeadLettered != 6 {
		t.Fatalf("a dry run changed something: %+v", st)
	}
}
