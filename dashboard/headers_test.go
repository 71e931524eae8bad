package dashboard_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/berthq/berth/dashboard"
)

// Every answer of the dashboard carries the headers that keep it out of
// another site's frame (clickjacking: a hidden "Purge" button under a
// decoy), stop a browser guessing content types, and keep its pages out of
// caches and Referer headers: pages, assets, the API, errors, and the 401
// that asks for the token. Before, the 401 carried none of them (the token
// check ran outside the headers), and no answer had X-Frame-Options, which
// browsers that ignore CSP's frame-ancestors obey.
func TestSecurityHeadersOnEveryAnswer(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 1, 0)
	srv := serve(t, b, dashboard.Options{Token: testToken})
	type answer struct {
		method, path string
		token        bool
		status       int
	}
	for _, a := range []answer{
		{"GET", "/", true, 200},
		{"GET", "/queues/billing", true, 200},
		{"GET", "/assets/app.js", true, 200},
		{"GET", "/api/queues", true, 200},
		{"GET", "/queues/billing/messages/nope", true, 404},
		{"GET", "/nowhere", true, 404},
		{"GET", "/queues/billing/purge", true, 405},
		{"GET", "/", false, 401},
	} {
		req, _ := http.NewRequest(a.method, srv.URL+a.path, nil)
		if a.token {
			req.Header.Set("Authorization", "Bearer "+testToken)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != a.status {
			t.Errorf("%s %s: %d, want %d", a.method, a.path, resp.StatusCode, a.status)
		}
		h := resp.Header
		csp := h.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'self'", "frame-ancestors 'none'", "form-action 'self'", "base-uri 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("%s %s (%d): Content-Security-Policy %q lacks %s", a.method, a.path, a.status, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe") {
			t.Errorf("%s %s: Content-Security-Policy %q allows unsafe sources", a.method, a.path, csp)
		}
		for k, want := range map[string]string{"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"} {
			if got := h.Get(k); got != want {
				t.Errorf("%s %s (%d): %s %q, want %q", a.method, a.path, a.status, k, got, want)
			}
		}
	}
}
