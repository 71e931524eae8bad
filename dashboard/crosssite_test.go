package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// readCounting counts the dead-letter reads of its broker: on RabbitMQ each
// is a walk of the whole dead-letter queue (every letter taken and
// republished), on SQS a receive of each letter.
type readCounting struct {
	broker
	reads atomic.Int64
}

func (c *readCounting) ListDeadLetters(ctx context.Context, q string, limit int) ([]*sdk.Message, error) {
	c.reads.Add(1)
	return c.broker.ListDeadLetters(ctx, q, limit)
}

func (c *readCounting) GetDeadLetter(ctx context.Context, q, id string) (*sdk.Message, error) {
	c.reads.Add(1)
	return c.broker.GetDeadLetter(ctx, q, id)
}

// A request a browser makes for another site's page (an <img>, a no-cors
// fetch, a frame) is refused before it reaches the broker; a link followed
// from another site (a top-level navigation), the dashboard's own pages and
// requests without Fetch Metadata (curl, programs) are served. Before, only
// POSTs were guarded: any web page the operator opened could make the
// dashboard read the dead-letter queues, as often as it liked.
func TestCrossSiteReadsRefused(t *testing.T) {
	for _, token := range []string{"", testToken} {
		b := &readCounting{broker: memoryBroker(t)}
		ids := seed(t, b.broker, 3, 0)
		srv := serve(t, b, dashboard.Options{Token: token})
		paths := []string{"/queues/billing", "/queues/billing/messages/" + ids[0], "/queues/billing/confirm?action=purge&all=1",
			"/api/queues/billing/dead-letters", "/api/queues/billing/dead-letters/" + ids[0]}
		do := func(path, site, mode, dest string) int {
			t.Helper()
			req, _ := http.NewRequest("GET", srv.URL+path, nil)
			for k, v := range map[string]string{"Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode, "Sec-Fetch-Dest": dest} {
				if v != "" {
					req.Header.Set(k, v)
				}
			}
			if token != "" {
				req.SetBasicAuth("ops", token) // a browser sends what it was given
			}
			code, _ := post(t, req)
			return code
		}
		for _, path := range paths {
			for _, f := range [][3]string{
				{"cross-site", "no-cors", "image"},
				{"cross-site", "cors", "empty"},
				{"cross-site", "navigate", "iframe"},
				{"same-site", "no-cors", "script"},
				{"same-site", "navigate", "iframe"},
			} {
				if code := do(path, f[0], f[1], f[2]); code != http.StatusForbidden {
					t.Errorf("token %q: GET %s with Sec-Fetch-Site %s, Mode %s, Dest %s: %d, want 403", token, path, f[0], f[1], f[2], code)
				}
			}
		}
		if n := b.reads.Load(); n != 0 {
			t.Fatalf("token %q: cross-site requests read the dead letters %d time(s)", token, n)
		}
		for _, path := range paths {
			for _, f := range [][3]string{
				{"", "", ""},                            // curl, a program
				{"none", "navigate", "document"},        // typed, a bookmark
				{"same-origin", "cors", "empty"},        // the overview's refresh
				{"same-origin", "navigate", "document"}, // a link of the dashboard's
			} {
				if code := do(path, f[0], f[1], f[2]); code != http.StatusOK {
					t.Errorf("token %q: GET %s with Sec-Fetch-Site %q, Mode %q, Dest %q: %d, want 200", token, path, f[0], f[1], f[2], code)
				}
			}
		}
		// A link from another site (a chat; another port) opens a page that
		// leads to the one it names by a same-origin link, and reads
		// nothing: another site could open such links in a loop
		// (window.open, location), each a walk of the dead letters.
		before := b.reads.Load()
		for _, path := range paths {
			for _, site := range []string{"cross-site", "same-site"} {
				if code := do(path, site, "navigate", "document"); code != http.StatusOK {
					t.Errorf("token %q: a link from %s to %s: %d, want 200", token, site, path, code)
				}
			}
		}
		if n := b.reads.Load() - before; n != 0 {
			t.Errorf("token %q: links from other sites read the dead letters %d time(s)", token, n)
		}
	}
}

// TestCrossSiteLinkContinuesOnlyToThisOrigin: the page a link from another
// site gets leads to the path it named, escaped, and never to another host
// (a path beginning "//" or "/\" is one to a browser).
func TestCrossSiteLinkContinuesOnlyToThisOrigin(t *testing.T) {
	srv := serve(t, memoryBroker(t), dashboard.Options{})
	for path, want := range map[string]string{
		"/queues/billing?x=%3Cb%3E": `href="/queues/billing?x=%3Cb%3E"`,
		"//evil.example/x":          `href="/"`,
		"/%5Cevil.example/x":        `href="/%5Cevil.example/x"`,
	} {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		req.Header.Set("Sec-Fetch-Mode", "navigate")
		req.Header.Set("Sec-Fetch-Dest", "document")
		code, body := post(t, req)
		if code != http.StatusOK || !strings.Contains(body, want) || !strings.Contains(body, `id="continue"`) {
			t.Errorf("GET %s from another site: %d, want 200 with %s\n%s", path, code, want, body)
		}
	}
}

// In a browser: a page of another site (localhost is not the site of
// 127.0.0.1) that loads a dashboard page as an image does not make the
// dashboard read the broker; a link on it to the dashboard still opens it.
func TestBrowserCrossSiteImageDoesNotReadTheBroker(t *testing.T) {
	ctx := browser(t)
	b := &readCounting{broker: memoryBroker(t)}
	seed(t, b.broker, 3, 0)
	srv := serve(t, b, dashboard.Options{})
	var served atomic.Int64
	decoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>decoy</title>
<img src="%[1]s/queues/billing" onerror="document.title='loaded'" onload="document.title='loaded'">
<a id="open" href="%[1]s/queues/billing">dead letters</a>`, srv.URL)
	}))
	t.Cleanup(decoy.Close)
	page := strings.Replace(decoy.URL, "127.0.0.1", "localhost", 1) + "/"
	// The image's load or error comes after the dashboard answered it.
	run(t, ctx, chromedp.Navigate(page), chromedp.Poll(`document.title === "loaded"`, nil, chromedp.WithPollingTimeout(30*time.Second)))
	if served.Load() == 0 {
		t.Fatal("the decoy page was not served")
	}
	if n := b.reads.Load(); n != 0 {
		t.Fatalf("another site's <img> made the dashboard read the dead letters %d time(s)", n)
	}
	run(t, ctx, clickNav("#open", "/queues/billing", "#continue"))
	if n := b.reads.Load(); n != 0 {
		t.Fatalf("another site's link made the dashboard read the dead letters %d time(s) before the operator continued", n)
	}
	// The same URL, now asked from the dashboard's own page.
	run(t, ctx, chromedp.Evaluate(`setTimeout(() => document.querySelector("#continue").click(), 0)`, nil))
	for deadline := time.Now().Add(30 * time.Second); ; {
		var ok bool // an evaluation during the navigation fails: asked again
		if err := chromedp.Run(ctx, chromedp.Evaluate(`document.readyState === "complete" && document.querySelector("#dead-letters") !== null`, &ok)); err == nil && ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("continuing from the link's page did not open the dead letters")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := number(t, ctx, "#matched"); got != 3 {
		t.Fatalf("the dashboard opened from another site's link shows %d dead letters, want 3", got)
	}
}
