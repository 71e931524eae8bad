package dashboard_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// noRedirect is a client that returns a redirect instead of following it.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// The banner after a change is the server's record of what it did. Before,
// it was written from the redirect's query string, so a link such as
// /queues/billing?done=redrive&n=5000 showed "redriven 5000 dead letter(s)"
// on a page where nothing had been redriven, and ?done=paused "Queue
// paused" on a queue nobody paused.
func TestBannerIsNotTakenFromTheLink(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 3, 0)
	srv := serve(t, b, dashboard.Options{Pauses: pauseTable(t)})
	for _, q := range []string{
		"done=redrive&n=5000&missed=0", "done=purge&n=7&missed=2&gone=1", "done=paused", "done=resumed",
		"done=already-paused", "done=not-paused", "result=made-up", "result=",
	} {
		code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing?"+q)
		if code != 200 || strings.Contains(page, `id="flash"`) {
			t.Errorf("/queues/billing?%s (%d) shows a banner for a change the server did not make", q, code)
		}
	}
	if st := stats(t, b); st.DeadLettered != 3 {
		t.Fatalf("the dead letters changed: %+v", st)
	}
}

// The banner a change redirects to is shown once, on its own queue's page,
// and says what the server did.
func TestBannerOnceOnItsQueue(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 3, 0)
	if err := b.Publish(context.Background(), "emails", &sdk.Message{Type: "email.send", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, b, dashboard.Options{Pauses: pauseTable(t)})
	change := func(path string, form url.Values) string {
		t.Helper()
		req := mustReq("POST", srv.URL+path, "application/x-www-form-urlencoded", form.Encode())
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		u, err := url.Parse(loc)
		if resp.StatusCode != http.StatusSeeOther || err != nil || u.Query().Get("result") == "" {
			t.Fatalf("POST %s: %d %q, want a redirect with a result", path, resp.StatusCode, loc)
		}
		for _, k := range []string{"done", "n", "missed", "gone", "incomplete"} {
			if u.Query().Has(k) {
				t.Errorf("POST %s redirects to %q: %s in the query", path, loc, k)
			}
		}
		return srv.URL + loc
	}
	banner := func(u string) string {
		t.Helper()
		code, page := get(t, http.DefaultClient, u)
		if code != 200 {
			t.Fatalf("GET %s: %d", u, code)
		}
		_, after, ok := strings.Cut(page, `<p class="flash" id="flash">`)
		if !ok {
			return ""
		}
		text, _, _ := strings.Cut(after, "</p>")
		return text
	}

	loc := change("/queues/billing/purge", url.Values{"all": {"1"}, "limit": {"2"}, "type": {"billing.charge"}})
	if !strings.Contains(loc, "type=billing.charge") {
		t.Errorf("the redirect %q lost the filter", loc)
	}
	// Another queue's page does not show it, nor use it up.
	if got := banner(strings.Replace(loc, "/queues/billing?", "/queues/emails?", 1)); got != "" {
		t.Errorf("another queue's page shows %q", got)
	}
	if got := banner(loc); got != "purged 2 dead letter(s)" {
		t.Errorf("banner %q, want purged 2 dead letter(s)", got)
	}
	if got := banner(loc); got != "" {
		t.Errorf("the banner shows again (%q): it is single-use", got)
	}
	if st := stats(t, b); st.DeadLettered != 1 {
		t.Fatalf("after the purge: %+v", st)
	}

	if got := banner(change("/queues/billing/pause", nil)); !strings.HasPrefix(got, "Queue paused") {
		t.Errorf("pause banner %q", got)
	}
	if got := banner(change("/queues/billing/pause", nil)); got != "The queue was already paused: nothing changed." {
		t.Errorf("second pause banner %q", got)
	}
	if got := banner(change("/queues/billing/resume", nil)); got != "Queue resumed." {
		t.Errorf("resume banner %q", got)
	}
	if got := banner(change("/queues/billing/resume", nil)); got != "The queue was not paused: nothing changed." {
		t.Errorf("second resume banner %q", got)
	}
}
