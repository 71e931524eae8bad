package dashboard_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// appearing is a broker that starts listing one more queue, with a name
// only a foreign producer would give it (RabbitMQ lists every queue of its
// vhost), when the test says so.
type appearing struct {
	broker
	extra atomic.Pointer[string]
}

func (a *appearing) Queues(ctx context.Context) ([]string, error) {
	names, err := a.broker.(interface {
		Queues(context.Context) ([]string, error)
	}).Queues(ctx)
	if q := a.extra.Load(); q != nil && err == nil {
		names = append(slices.Clone(names), *q)
	}
	return names, err
}

func (a *appearing) Stats(ctx context.Context, q string) (sdk.QueueStats, error) {
	if e := a.extra.Load(); e != nil && q == *e {
		return sdk.QueueStats{Queue: q}, nil
	}
	return a.broker.Stats(ctx, q)
}

// A queue that appears while the overview is open is shown as the server
// shows text, its bidirectional override as an escape. Before, the live
// refresh added its row with the name as it is (textContent: no HTML, but
// the override reversed the text around it).
func TestBrowserNewQueueNameEscaped(t *testing.T) {
	ctx := browser(t)
	b := &appearing{broker: memoryBroker(t)}
	seed(t, b.broker, 1, 0)
	srv := serve(t, b, dashboard.Options{})
	run(t, ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(`tr[data-queue="billing"]`, chromedp.ByQuery),
		chromedp.Poll(`Number(document.querySelector("table[data-live]").dataset.refreshes || 0) >= 1`, nil, chromedp.WithPollingTimeout(20*time.Second)))
	name := "evil\u202etxt.exe"
	b.extra.Store(&name)
	// The refresh reloads the page: evaluate until the row is there,
	// passing over an evaluation the reload cut short.
	const find = `(() => { const r = Array.from(document.querySelectorAll("tr[data-queue]")).find((r) => r.dataset.queue === "evil\u202etxt.exe"); return r ? r.cells[0].textContent.trim() : ""; })()`
	var shown string
	for deadline := time.Now().Add(20 * time.Second); shown == "" && time.Now().Before(deadline); {
		if err := chromedp.Run(ctx, chromedp.Evaluate(find, &shown)); err != nil {
			shown = ""
		}
		if shown == "" {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if want := `evil\u202etxt.exe`; shown != want {
		t.Fatalf("new queue shown as %q, want %q", shown, want)
	}
}
