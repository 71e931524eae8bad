package main

import (
	"context"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// scanStoppedView is a broker whose dead-letter scan for an ID stops before
// the end of the queue, as an SQS Get does that finds dead letters another
// reader holds invisible (or that would hold more than 10,000).
type scanStoppedView struct {
	unpagedView
	reason string
}

func (v scanStoppedView) GetDeadLetter(context.Context, string, string) (*sdk.Message, error) {
	return nil, &sqs.ScanError{Queue: "billing", Remaining: 2, Reason: v.reason}
}

// berth dlq show of an ID whose scan stopped before the end of the
// dead-letter queue exited 1, as a failure, where a dlq list of the same ID
// exits 4 (partial: run it again). It now exits 4, the reason escaped.
func TestShowOfAStoppedScanIsPartial(t *testing.T) {
	b, _ := deadLettered(t, 1)
	v := scanStoppedView{unpagedView: unpagedView{Broker: b, DeadLetters: b, Inspector: b}, reason: "held \x1b[31m elsewhere"}
	e := env{open: func(context.Context, string) (sdk.Broker, error) { return v, nil }}
	for _, args := range [][]string{{"dlq", "show", "billing", "id\x1b]0;x\a"}, {"-json", "dlq", "show", "billing", "id"}} {
		r := berthEnv(t, context.Background(), b, e, args...)
		if r.code != exitPartial || !strings.Contains(r.err, "the scan stopped before the end of the dead-letter queue") ||
			!strings.Contains(r.err, `held \x1b[31m elsewhere`) || strings.ContainsAny(r.err+r.out, "\x1b\a") {
			t.Errorf("%q: exit %d, want %d, saying the scan stopped, escaped:\n%s%s", args, r.code, exitPartial, r.out, r.err)
		}
	}
}
