package dashboard_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/ledger/pgledger"
)

// TestJobPagesAnyTime: a job whose row another tool wrote with 'infinity',
// '-infinity' or a year past 9999 (PostgreSQL allows them) failed the job
// pages with a scan error, and the API could not write a year past 9999.
// The pages show "infinity" and "-infinity" now, and the API writes the
// times ledger.Infinity and ledger.NegativeInfinity stand for them.
func TestJobPagesAnyTime(t *testing.T) {
	b, pool := postgresBrokerPool(t)
	ids := seed(t, b, 1, 1)
	if _, err := pool.Exec(context.Background(), `UPDATE `+b.Schema()+`.jobs SET status = 'retry', available_at = 'infinity',
		created_at = '-infinity', updated_at = '12000-01-01 00:00:00+00' WHERE message_id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	jobs, err := pgledger.NewJobs(pool, b.Schema())
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, b, dashboard.Options{Jobs: jobs})
	code, page := get(t, http.DefaultClient, srv.URL+"/jobs/"+ids[0])
	if code != 200 || !strings.Contains(page, "<th>Next attempt</th><td>infinity</td>") || !strings.Contains(page, "<th>First seen</th><td>-infinity</td>") ||
		!strings.Contains(page, "<th>Updated</th><td>infinity</td>") {
		t.Errorf("/jobs/{id}: %d %s", code, page)
	}
	if code, page := get(t, http.DefaultClient, srv.URL+"/jobs"); code != 200 || !strings.Contains(page, ">infinity<") {
		t.Errorf("/jobs: %d %s", code, page)
	}
	if code, body := get(t, http.DefaultClient, srv.URL+"/api/jobs/"+ids[0]); code != 200 || !strings.Contains(body, `"NextAttemptAt":"9999-12-31T23:59:59.999999999Z"`) {
		t.Errorf("/api/jobs/{id}: %d %s", code, body)
	}
	if code, body := get(t, http.DefaultClient, srv.URL+"/api/jobs"); code != 200 || !strings.Contains(body, `"UpdatedAt":"9999-12-31T23:59:59.999999999Z"`) {
		t.Errorf("/api/jobs: %d %s", code, body)
	}
}
