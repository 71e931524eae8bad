package dashboard_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berthq/berth/dashboard"
)

// The overview's live refresh knows a queue the page shows whatever its
// name holds: a carriage return (which an HTML parser reads as a line
// feed), a NUL (which html/template writes as U+FFFD) or bytes that are
// not UTF-8 (which encoding/json writes as U+FFFD, one per byte). Before,
// it compared the API's name with the row's data-queue attribute, found no
// row for such a queue, and reloaded the page at every refresh, for ever.
func TestBrowserOddQueueNameDoesNotReloadForEver(t *testing.T) {
	for _, c := range []struct{ sub, name string }{
		{"cr", "cr\rqueue"}, {"crlf", "crlf\r\nqueue"}, {"nul", "nul\x00queue"}, {"not-utf8", "bad\xe2\x82utf8"},
	} {
		name := c.name
		t.Run(c.sub, func(t *testing.T) {
			ctx := browser(t)
			b := &appearing{broker: memoryBroker(t)}
			seed(t, b.broker, 1, 0)
			b.extra.Store(&name)
			d, err := dashboard.New(b, dashboard.Options{})
			if err != nil {
				t.Fatal(err)
			}
			var loads atomic.Int32
			srv := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/" {
					loads.Add(1)
				}
				d.ServeHTTP(w, r)
			}))
			run(t, ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(`tr[data-queue="billing"]`, chromedp.ByQuery))
			// Three refreshes on one page; a reload would start the count again.
			var refreshes int
			for deadline := time.Now().Add(20 * time.Second); refreshes < 3; {
				if err := chromedp.Run(ctx, chromedp.Evaluate(`Number(document.querySelector("table[data-live]")?.dataset.refreshes || 0)`, &refreshes)); err != nil {
					refreshes = 0 // a reload cut the evaluation short
				}
				if ctx.Err() != nil || time.Now().After(deadline) {
					t.Fatalf("%q: no three refreshes on one page in the test's time; the overview was loaded %d times", name, loads.Load())
				}
				time.Sleep(100 * time.Millisecond)
			}
			if n := loads.Load(); n != 1 {
				t.Errorf("%q: the overview was loaded %d times, want 1", name, n)
			}
			var rows int
			run(t, ctx, chromedp.Evaluate(`document.querySelectorAll("#queues tbody tr[data-queue]").length`, &rows))
			if rows != 2 {
				t.Errorf("%q: %d rows after the refreshes, want 2", name, rows)
			}
		})
	}
}

// serveHandler serves h on a test server closed at the end of the test.
func serveHandler(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}
