package dashboard_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/ledger/pgledger"
)

// An ID, key or filter that no row can hold (invalid UTF-8 or a NUL, which
// a URL or a JSON body carries as easily as any text) is not found, or
// matches nothing, on the PostgreSQL broker and its job table: never a 500
// logged as a failure of the database.
func TestUnstorableTextIsNotFound(t *testing.T) {
	b, pool := postgresBrokerPool(t)
	ids := seed(t, b, 2, 0)
	jobs, err := pgledger.NewJobs(pool, b.Schema())
	if err != nil {
		t.Fatal(err)
	}
	logs := newSyncBuffer()
	srv := serve(t, b, dashboard.Options{Jobs: jobs, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	for _, c := range []struct {
		path string
		want int
	}{
		{"/queues/billing/messages/%FF", 404},
		{"/queues/billing/messages/a%00b", 404},
		{"/api/queues/billing/dead-letters/%FF", 404},
		{"/api/queues/%FF/dead-letters/x", 400},
		{"/jobs/%FF", 404},
		{"/api/jobs/a%00b", 404},
		{"/jobs?key=%FF", 404},
		{"/api/jobs?type=%00", 200},
		{"/jobs?queue=%FF", 200},
	} {
		if code, body := get(t, http.DefaultClient, srv.URL+c.path); code != c.want {
			t.Errorf("%s: %d, want %d: %.200s", c.path, code, c.want, body)
		}
	}
	// Confirming, and the change itself, count such an ID as missing and do
	// the others.
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?action=redrive&id=%FF&id="+ids[0])
	if code != 200 || !strings.Contains(page, `<span id="confirm-count">1</span>`) || !strings.Contains(page, "1 of the selected are no longer dead letters") {
		t.Errorf("confirm: %d %s", code, page)
	}
	code, body := post(t, mustReq("POST", srv.URL+"/api/queues/billing/purge", "application/json", `{"ids":["a\u0000b","`+ids[1]+`"]}`))
	if code != 200 || !strings.Contains(body, `"done":1`) || !strings.Contains(body, `"missed":1`) {
		t.Errorf("purge: %d %s", code, body)
	}
	if l := logs.String(); strings.Contains(l, "request failed") {
		t.Errorf("bad input logged as a failure:\n%s", l)
	}
}

// Pausing or resuming a queue whose name is not text (from the URL) is the
// operator's error, 400, on both routes: not a 500 from the database.
func TestPauseRoutesRefuseUnstorableQueue(t *testing.T) {
	b := memoryBroker(t)
	srv := serve(t, b, dashboard.Options{Pauses: pauseTable(t)})
	for _, path := range []string{"/api/queues/%FF/pause", "/api/queues/%FF/resume", "/api/queues/a%00b/resume"} {
		if code, body := post(t, mustReq("POST", srv.URL+path, "application/json", "")); code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", path, code, body)
		}
	}
}
