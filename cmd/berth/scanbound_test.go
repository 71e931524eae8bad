package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/berthq/berth/sdk"
)

// unpagedView is a memory broker seen as SQS is: it can neither page nor
// sweep its dead letters, so a listing reads at most -scan-limit of them in
// one ListDeadLetters call.
type unpagedView struct {
	sdk.Broker
	sdk.DeadLetters
	sdk.Inspector
}

func (unpagedView) Close() error { return nil }

// A page past -scan-limit on a broker that cannot page its dead letters
// (SQS) cannot be read: the list says it is partial (exit 4, raise
// -scan-limit) and gives no next page. Before, the broker's count made it
// look complete: it showed no dead letter, exited 0 and printed "next page:
// -offset 20", the page it had just failed to show.
func TestListPastScanLimitIsPartial(t *testing.T) {
	b, _ := deadLettered(t, 30)
	e := env{open: func(context.Context, string) (sdk.Broker, error) {
		return unpagedView{Broker: b, DeadLetters: b, Inspector: b}, nil
	}}
	for _, args := range [][]string{
		{"dlq", "list", "billing", "-offset", "20", "-limit", "5", "-scan-limit", "10"},
		{"dlq", "list", "billing", "-offset", "5", "-limit", "10", "-scan-limit", "10"}, // half the page is past the scan
	} {
		r := berthEnv(t, context.Background(), b, e, args...)
		if r.code != exitPartial || strings.Contains(r.out, "next page") || !strings.Contains(r.err, "-scan-limit") {
			t.Errorf("%v: exit %d, want %d with no next page and a word of -scan-limit:\n%s%s", args, r.code, exitPartial, r.out, r.err)
		}
		r = berthEnv(t, context.Background(), b, e, append([]string{"-json"}, args...)...)
		var l jsonList
		if err := json.Unmarshal([]byte(r.out), &l); err != nil {
			t.Fatalf("%v -json: %v: %s", args, err, r.out)
		}
		if r.code != exitPartial || l.Complete || l.Incomplete == "" || l.NextOffset != nil {
			t.Errorf("%v -json: exit %d, complete %v, incomplete %q, next %v", args, r.code, l.Complete, l.Incomplete, l.NextOffset)
		}
	}
	// Within the scan, the count is the broker's and the list is whole.
	r := berthEnv(t, context.Background(), b, e, "dlq", "list", "billing", "-offset", "5", "-limit", "5", "-scan-limit", "10")
	if r.code != exitOK || !strings.Contains(r.out, "dead letters 6-10 of 30\n") || !strings.Contains(r.out, "next page: -offset 10") {
		t.Errorf("a page within the scan: exit %d:\n%s%s", r.code, r.out, r.err)
	}
}
