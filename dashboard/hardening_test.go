package dashboard_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/berthq/berth/dashboard"
)

// testToken is a token of the length the dashboard accepts.
const testToken = "s3cret-token-for-tests"

// HSTS: an answer served over TLS tells the browser to use HTTPS only
// (Strict-Transport-Security), the 401 included; over plain HTTP no answer
// carries it (browsers ignore it there, and it would claim HTTPS the server
// does not serve). Before, no answer had it, over TLS either.
func TestHSTSOnlyOverTLS(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 1, 0)
	d, err := dashboard.New(b, dashboard.Options{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	tlsSrv := httptest.NewTLSServer(d)
	t.Cleanup(tlsSrv.Close)
	plain := httptest.NewServer(d)
	t.Cleanup(plain.Close)
	for _, c := range []struct {
		srv  *httptest.Server
		want string
	}{{tlsSrv, "max-age=31536000"}, {plain, ""}} {
		for _, a := range []struct {
			path   string
			token  bool
			status int
		}{{"/", true, 200}, {"/api/queues", true, 200}, {"/assets/app.js", true, 200}, {"/nowhere", true, 404}, {"/", false, 401}} {
			req, _ := http.NewRequest("GET", c.srv.URL+a.path, nil)
			if a.token {
				req.Header.Set("Authorization", "Bearer "+testToken)
			}
			resp, err := c.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != a.status {
				t.Errorf("%s: %d, want %d", c.srv.URL+a.path, resp.StatusCode, a.status)
			}
			if got := resp.Header.Get("Strict-Transport-Security"); got != c.want {
				t.Errorf("%s (%d): Strict-Transport-Security %q, want %q", c.srv.URL+a.path, a.status, got, c.want)
			}
		}
	}
}

// A token shorter than MinTokenLength bytes is refused by New with an
// error wrapping ErrShortToken that does not show it; one of that length
// and no token at all (a loopback dashboard) are accepted. Before, a token
// of 3 characters was accepted.
func TestShortTokenRefused(t *testing.T) {
	b := memoryBroker(t)
	for _, tok := range []string{"abc", "s3cret", strings.Repeat("x", dashboard.MinTokenLength-1)} {
		d, err := dashboard.New(b, dashboard.Options{Token: tok})
		if !errors.Is(err, dashboard.ErrShortToken) || d != nil {
			t.Errorf("token of %d bytes: %v, want ErrShortToken", len(tok), err)
			continue
		}
		if strings.Contains(err.Error(), tok) {
			t.Errorf("the error shows the token: %v", err)
		}
	}
	if dashboard.MinTokenLength < 16 {
		t.Errorf("MinTokenLength %d, want at least 16", dashboard.MinTokenLength)
	}
	for _, tok := range []string{"", strings.Repeat("x", dashboard.MinTokenLength), testToken} {
		if _, err := dashboard.New(b, dashboard.Options{Token: tok}); err != nil {
			t.Errorf("token of %d bytes: %v", len(tok), err)
		}
	}
}

// records is a slog.Handler that keeps what it is given.
type records struct {
	mu  sync.Mutex
	all []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.all = append(h.all, r.Clone())
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

// attrs returns the records' attributes, groups flattened as "group.key".
func attrs(r slog.Record) map[string]string {
	m := map[string]string{}
	var add func(prefix string, a slog.Attr)
	add = func(prefix string, a slog.Attr) {
		if a.Value.Kind() == slog.KindGroup {
			for _, g := range a.Value.Group() {
				add(prefix+a.Key+".", g)
			}
			return
		}
		m[prefix+a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { add("", a); return true })
	return m
}

// A request with a wrong token (a bearer token or the password of basic
// auth) is logged at WARN with its remote address and path, never the token
// it tried; a request with no token at all (a browser's first, before it
// asks for the password) and one with the right token are not. Before,
// failed logins were not logged at all.
func TestWrongTokenLogged(t *testing.T) {
	b := memoryBroker(t)
	h := &records{}
	srv := serve(t, b, dashboard.Options{Token: testToken, Logger: slog.New(h)})
	const tried = "guessed-token-1234567"
	get := func(path string, set func(*http.Request)) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		set(req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	get("/", func(*http.Request) {})
	get("/api/queues", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+testToken) })
	h.mu.Lock()
	if len(h.all) != 0 {
		t.Errorf("no token and the right token were logged: %v", h.all)
	}
	h.mu.Unlock()

	get("/queues/billing", func(r *http.Request) { r.SetBasicAuth("ops", tried) })
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.all) != 1 {
		t.Fatalf("a wrong token: %d records, want 1", len(h.all))
	}
	r := h.all[0]
	a := attrs(r)
	if r.Level != slog.LevelWarn || !strings.HasPrefix(a["remote"], "127.0.0.1:") || a["path"] != "/queues/billing" || a["method"] != "GET" {
		t.Errorf("the record: %s %q %v", r.Level, r.Message, a)
	}
	for k, v := range a {
		if strings.Contains(v, tried) || strings.Contains(k, tried) {
			t.Errorf("the record shows the token tried: %s=%q", k, v)
		}
	}
	if strings.Contains(r.Message, tried) {
		t.Errorf("the message shows the token tried: %q", r.Message)
	}
}
