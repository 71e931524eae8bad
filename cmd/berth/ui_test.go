package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// startUI starts berth ui with args and returns its address and stderr;
// it is stopped (Ctrl-C) when the test ends, and must then exit 0.
func startUI(t *testing.T, e env, args ...string) (string, *syncbuf.Buffer) {
	t.Helper()
	addr, stderr, stop := uiRun(t, e, args...)
	t.Cleanup(func() {
		if code := stop(); code != 0 {
			t.Errorf("ui exited %d: %s", code, stderr.String())
		}
	})
	return addr, stderr
}

func httpGet(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestUIRefusesAPublicAddressWithoutAToken(t *testing.T) {
	b, _ := deadLettered(t, 1)
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:8080"} {
		r := berth(t, b, "ui", "-addr", addr)
		if r.code != exitUsage || !strings.Contains(r.err, "refusing to serve") {
			t.Errorf("ui -addr %s: exit %d %s", addr, r.code, r.err)
		}
	}
	if r := berth(t, b, "ui", "-addr", "nonsense"); r.code != exitUsage {
		t.Errorf("bad -addr: %d", r.code)
	}
}

func TestUIServesLoopbackAndHidesThePassword(t *testing.T) {
	b, _ := deadLettered(t, 2)
	e := env{open: func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil }}
	addr, stderr := startUI(t, e, "-addr", "127.0.0.1:0", "-url", "postgres://admin:hunter2@db.internal/app?password=hunter2")
	code, page := httpGet(t, "http://"+addr+"/", "")
	if code != 200 || !strings.Contains(page, `data-queue="billing"`) || !strings.Contains(page, "postgres://admin@db.internal/app") {
		t.Fatalf("overview %d:\n%s", code, page)
	}
	for _, path := range []string{"/", "/queues/billing", "/api/queues"} {
		if _, page := httpGet(t, "http://"+addr+path, ""); strings.Contains(page, "hunter2") {
			t.Errorf("%s shows the password", path)
		}
	}
	if strings.Contains(stderr.String(), "hunter2") || !strings.Contains(stderr.String(), "serving http://127.0.0.1:") {
		t.Errorf("stderr: %s", stderr.String())
	}
}

func TestUIPublicAddressWithAToken(t *testing.T) {
	b, _ := deadLettered(t, 1)
	e := env{
		open:   func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil },
		getenv: func(k string) string { return map[string]string{"BERTH_UI_TOKEN": uiTestToken}[k] },
	}
	addr, _ := startUI(t, e, "-addr", "0.0.0.0:0", "-url", "mem://", "-read-only")
	_, port, _ := net.SplitHostPort(addr)
	if code, _ := httpGet(t, "http://127.0.0.1:"+port+"/", ""); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d", code)
	}
	// Plain HTTP: no HSTS, which is for answers over TLS only.
	resp, err := http.Get("http://127.0.0.1:" + port + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if v := resp.Header.Get("Strict-Transport-Security"); v != "" {
		t.Errorf("Strict-Transport-Security %q over plain HTTP", v)
	}
	code, page := httpGet(t, "http://127.0.0.1:"+port+"/queues/billing", uiTestToken)
	if code != 200 || !strings.Contains(page, `id="read-only"`) || strings.Contains(page, `id="redrive"`) {
		t.Fatalf("with the token: %d", code)
	}
}

func TestUIDemo(t *testing.T) {
	if r := berth(t, nil, "ui", "-demo", "-url", "postgres://db/app"); r.code != exitUsage || !strings.Contains(r.err, "mem://") {
		t.Fatalf("-demo on postgres: %d %s", r.code, r.err)
	}
	addr, _ := startUI(t, env{open: openURL}, "-addr", "127.0.0.1:0", "-url", "mem://", "-demo")
	code, body := httpGet(t, "http://"+addr+"/api/queues", "")
	if code != 200 || !strings.Contains(body, `"queue":"billing","ready":42,"delayed":0,"in_flight":0,"dead_lettered":7`) {
		t.Fatalf("demo queues: %d %s", code, body)
	}
}

// With -db the job pages read the ledger's own tables (a memory broker has
// no job state of its own).
func TestUIJobPagesFromTheLedger(t *testing.T) {
	ctx := context.Background()
	dsn, schema, store := migratedLedger(t, "cli_ledger_")
	now := time.Now()
	if err := store.Write(ctx, []ledger.Event{{MessageID: "job-1", Queue: "billing", Type: "billing.charge", Status: ledger.StatusRetrying,
		Attempt: 1, At: now, StartedAt: now, Error: "gateway \x1b[31mtimeout", Class: sdk.ClassTransient}}); err != nil {
		t.Fatal(err)
	}
	b, _ := deadLettered(t, 1)
	e := env{open: func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil }}
	addr, _ := startUI(t, e, "-addr", "127.0.0.1:0", "-url", "mem://", "-db", dsn, "-schema", schema)
	code, page := httpGet(t, "http://"+addr+"/jobs?status=retrying", "")
	if code != 200 || !strings.Contains(page, "job-1") || strings.Contains(page, "\x1b") {
		t.Fatalf("/jobs: %d\n%s", code, page)
	}
	code, page = httpGet(t, "http://"+addr+"/jobs/job-1", "")
	if code != 200 || !strings.Contains(page, `id="job-status">retrying<`) || !strings.Contains(page, `gateway \x1b[31mtimeout`) {
		t.Fatalf("/jobs/job-1: %d\n%s", code, page)
	}
}

// A page on an attacker's domain that re-points it at 127.0.0.1 (DNS
// rebinding) is the dashboard's own origin to the browser, so cross-origin
// protection does not stop it; without a token only a loopback Host may be
// served.
func TestUIWithoutATokenRefusesAForeignHost(t *testing.T) {
	b, _ := deadLettered(t, 3)
	e := env{open: func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil }}
	addr, _ := startUI(t, e, "-addr", "127.0.0.1:0", "-url", "mem://")
	_, port, _ := net.SplitHostPort(addr)
	do := func(method, host, path, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		req.Host = host
		req.Header.Set("Origin", "http://"+host)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	foreign := "rebound.example:" + port
	if code := do("POST", foreign, "/api/queues/billing/purge", `{"all":true}`); code != http.StatusForbidden {
		t.Errorf("purge for Host %s: %d, want 403", foreign, code)
	}
	if code := do("GET", foreign, "/api/queues/billing/dead-letters", ""); code != http.StatusForbidden {
		t.Errorf("dead letters for Host %s: %d, want 403", foreign, code)
	}
	if st := stats(t, b); st.DeadLettered != 3 {
		t.Fatalf("a request for a foreign Host purged: %d dead letters left of 3", st.DeadLettered)
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port, "app.localhost:" + port} {
		if code := do("GET", host, "/api/queues", ""); code != http.StatusOK {
			t.Errorf("GET for Host %s: %d, want 200", host, code)
		}
	}
	if code := do("POST", "localhost:"+port, "/api/queues/billing/purge", `{"all":true,"dry_run":true}`); code != http.StatusOK {
		t.Errorf("dry-run purge for Host localhost: %d", code)
	}
}

// silentStats is a broker whose statistics never come: each read waits
// until its context ends, as a network broker's does when its server is gone
// without a word.
type silentStats struct{ unpagedView }

func (silentStats) Stats(ctx context.Context, _ string) (sdk.QueueStats, error) {
	<-ctx.Done()
	return sdk.QueueStats{}, ctx.Err()
}

// berth ui gives the dashboard its -request-timeout: a page whose broker
// does not answer fails with 503 within it, saying so. A bound that is not
// positive is a usage error, before the broker is opened.
func TestUIRequestTimeout(t *testing.T) {
	b, _ := deadLettered(t, 1)
	opened := false
	e := env{open: func(context.Context, string) (sdk.Broker, error) {
		opened = true
		return silentStats{unpagedView{Broker: b, DeadLetters: b, Inspector: b}}, nil
	}}
	for _, bad := range []string{"0s", "-1s"} {
		if r := berthEnv(t, context.Background(), b, e, "ui", "-request-timeout", bad); r.code != exitUsage || !strings.Contains(r.err, "-request-timeout") {
			t.Errorf("ui -request-timeout %s: exit %d %s", bad, r.code, r.err)
		}
	}
	if opened {
		t.Error("a bad -request-timeout opened the broker")
	}
	addr, _ := startUI(t, e, "-url", "mem://", "-addr", "127.0.0.1:0", "-queues", "billing", "-request-timeout", "50ms")
	code, body := httpGet(t, "http://"+addr+"/queues/billing", "")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "did not answer within 50ms") {
		t.Errorf("a page of a broker that does not answer: %d %s", code, body)
	}
}
