package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/berthq/berth/sdk"
)

// interruptedListing is a broker whose queue listing is interrupted (the
// operator's Ctrl-C arriving while the listing is under way) on its second
// call.
type interruptedListing struct {
	nopClose
	calls  int
	cancel context.CancelFunc
}

func (b *interruptedListing) Queues(ctx context.Context) ([]string, error) {
	if b.calls++; b.calls < 2 {
		return b.Broker.Queues(ctx)
	}
	b.cancel()
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestStatsWatchInterruptedWhileListing: "berth stats -watch" of every queue
// ends when interrupted and exits 0, as it does when the interrupt comes
// between refreshes; an interrupt that came while the broker listed its
// queues made it fail with "context canceled" and exit 1.
func TestStatsWatchInterruptedWhileListing(t *testing.T) {
	b, _ := deadLettered(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	broker := &interruptedListing{nopClose: nopClose{b}, cancel: cancel}
	var out, errOut bytes.Buffer
	code := run(ctx, []string{"-url", "mem://", "stats", "-watch", "-interval", "1ms"}, env{
		stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" },
		open: func(context.Context, string) (sdk.Broker, error) { return broker, nil },
	})
	if code != exitOK || errOut.Len() != 0 {
		t.Fatalf("interrupted -watch: exit %d, stderr %q", code, errOut.String())
	}
	if broker.calls != 2 || !strings.Contains(out.String(), "billing") {
		t.Fatalf("%d listings, output:\n%s", broker.calls, out.String())
	}
}
