package dashboard_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// stalling is a memory broker whose statistics stop coming once stall is
// set: each Stats call then waits until its context ends. It counts the
// calls waiting and the most that ever waited at once.
type stalling struct {
	broker
	stall atomic.Bool

	mu               sync.Mutex
	waiting, maxWait int
}

func (s *stalling) Stats(ctx context.Context, queue string) (sdk.QueueStats, error) {
	if !s.stall.Load() {
		return s.broker.Stats(ctx, queue)
	}
	s.mu.Lock()
	s.waiting++
	s.maxWait = max(s.maxWait, s.waiting)
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	s.waiting--
	s.mu.Unlock()
	return sdk.QueueStats{}, ctx.Err()
}

func (s *stalling) most() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxWait
}

// The overview's live refresh does not send a refresh while the last one
// still waits on the server: ticks meanwhile are skipped. Before, a broker
// that stopped answering got a new request every 2 s, each waiting on it:
// they took the browser's connections to the dashboard (six), so that no
// page of it, not even the error page, could load.
func TestBrowserRefreshesDoNotPileUp(t *testing.T) {
	ctx := browser(t)
	b := &stalling{broker: memoryBroker(t)}
	seed(t, b, 1, 1)
	srv := serve(t, b, dashboard.Options{Queues: []string{"billing"}, Timeout: time.Hour})
	t.Cleanup(srv.CloseClientConnections) // ends the refreshes waiting (before srv.Close waits for them)
	run(t, ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(`tr[data-queue="billing"]`, chromedp.ByQuery))
	b.stall.Store(true)
	// Two ticks pass with a refresh waiting (data-skipped counts them), or
	// a second refresh reaches the broker while the first still waits.
	var skipped bool
	for !skipped && b.most() < 2 {
		if err := chromedp.Run(ctx, chromedp.Evaluate(`Number(document.querySelector("table[data-live]").dataset.skipped || 0) >= 2`, &skipped)); err != nil {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatal("no refresh tick in the test's time")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if note := text(t, ctx, "#refreshed"); !strings.Contains(note, "Waiting for the broker") {
		t.Errorf("the page does not say its counts wait on the broker: %q", note)
	}
	if n := b.most(); n != 1 {
		t.Fatalf("%d refreshes waited on the broker at once, want 1 (the refresh in flight)", n)
	}
}
