package dashboard_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/ledger/pgledger"
)

// The job-state pages, on the PostgreSQL broker's jobs table read as a
// ledger.
func TestJobPages(t *testing.T) {
	b, pool := postgresBrokerPool(t)
	ids := seed(t, b, 3, 2)
	jobs, err := pgledger.NewJobs(pool, b.Schema())
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, b, dashboard.Options{Jobs: jobs})
	code, page := get(t, http.DefaultClient, srv.URL+"/jobs?status=dead")
	if code != 200 {
		t.Fatalf("/jobs: %d %s", code, page)
	}
	for _, id := range ids {
		if !strings.Contains(page, id) {
			t.Errorf("/jobs?status=dead lacks %s", id)
		}
	}
	if code, page := get(t, http.DefaultClient, srv.URL+"/jobs/"+ids[1]); code != 200 || !strings.Contains(page, `id="job-status">dead<`) || !strings.Contains(page, "card 1 declined") {
		t.Fatalf("/jobs/{id}: %d %s", code, page)
	}
	if code, body := get(t, http.DefaultClient, srv.URL+"/api/jobs/"+ids[0]); code != 200 || !strings.Contains(body, `"Status":"dead"`) {
		t.Fatalf("/api/jobs/{id}: %d %s", code, body)
	}
	if code, body := get(t, http.DefaultClient, srv.URL+"/api/jobs?status=enqueued"); code != 200 || strings.Count(body, `"MessageID"`) != 2 {
		t.Fatalf("/api/jobs?status=enqueued: %d %s", code, body)
	}
	if code, _ := get(t, http.DefaultClient, srv.URL+"/jobs?status=bogus"); code != 400 {
		t.Fatalf("bad status: %d", code)
	}
	if code, _ := get(t, http.DefaultClient, srv.URL+"/jobs/nope"); code != 404 {
		t.Fatalf("unknown job: %d", code)
	}
	// Without a ledger the pages do not exist.
	plain := serve(t, b, dashboard.Options{})
	if code, _ := get(t, http.DefaultClient, plain.URL+"/jobs"); code != 404 {
		t.Fatalf("/jobs without a ledger: %d", code)
	}
}
