package dashboard_test

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/ledger"
)

// href returns the decoded href of the link with id on page, or "".
func href(page, id string) string {
	m := regexp.MustCompile(`id="` + id + `" href="([^"]*)"`).FindStringSubmatch(page)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// The pager of a filtered dead-letter list keeps the filter: its links
// carry the filter as query parameters, not as one percent-encoded blob
// that the next page reads as no filter at all.
func TestPagerKeepsFilter(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 9, 0) // 6 permanent, 3 transient
	srv := serve(t, b, dashboard.Options{PageSize: 2})
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing?class=permanent&type=billing.charge,billing.refund")
	if code != 200 || !strings.Contains(page, `<span id="matched">6</span>`) {
		t.Fatalf("first page: %d", code)
	}
	next := href(page, "next")
	u, err := url.Parse(next)
	if err != nil || u.Path != "/queues/billing" {
		t.Fatalf("next link %q: %v", next, err)
	}
	if q := u.Query(); q.Get("class") != "permanent" || q.Get("type") != "billing.charge,billing.refund" || q.Get("offset") != "2" {
		t.Fatalf("next link %q: query %v, want class, type and offset", next, q)
	}
	code, page = get(t, http.DefaultClient, srv.URL+next)
	if code != 200 || !strings.Contains(page, `<span id="matched">6</span>`) || strings.Contains(page, "timeout") {
		t.Fatalf("following next %q: %d; want the second page of the 6 permanent failures", next, code)
	}
	if prev := href(page, "prev"); !strings.Contains(prev, "class=permanent") || !strings.Contains(prev, "offset=0") {
		t.Errorf("prev link %q lost the filter", prev)
	}
}

// pagedJobs is a ledger whose job list has two pages; it records the
// filters it was asked for.
type pagedJobs struct {
	ledger.Reader
	mu   sync.Mutex
	seen []ledger.Filter
}

func (p *pagedJobs) List(_ context.Context, f ledger.Filter) (ledger.Page, error) {
	p.mu.Lock()
	p.seen = append(p.seen, f)
	p.mu.Unlock()
	if f.After == "" {
		return ledger.Page{Jobs: []ledger.Job{{MessageID: "first", Queue: "billing", Status: ledger.StatusDead}}, Next: "cursor-1"}, nil
	}
	return ledger.Page{Jobs: []ledger.Job{{MessageID: "second", Queue: "billing", Status: ledger.StatusDead}}}, nil
}

// The jobs list's "next" link carries the cursor and the filter: it shows
// the next page, not the first again.
func TestJobsNextPage(t *testing.T) {
	b := memoryBroker(t)
	jobs := &pagedJobs{}
	srv := serve(t, b, dashboard.Options{Jobs: jobs})
	code, page := get(t, http.DefaultClient, srv.URL+"/jobs?status=dead&queue=billing")
	if code != 200 || !strings.Contains(page, "first") {
		t.Fatalf("first page: %d", code)
	}
	m := regexp.MustCompile(`<p class="pager"><a href="([^"]*)">next`).FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no next link")
	}
	next := html.UnescapeString(m[1])
	code, page = get(t, http.DefaultClient, srv.URL+next)
	if code != 200 || !strings.Contains(page, "second") {
		t.Errorf("following next %q: %d, not the second page", next, code)
	}
	jobs.mu.Lock()
	defer jobs.mu.Unlock()
	if last := jobs.seen[len(jobs.seen)-1]; last.After != "cursor-1" || last.Queue != "billing" || len(last.Statuses) != 1 || last.Statuses[0] != ledger.StatusDead {
		t.Errorf("next link %q asked for %+v, want the cursor with the filter", next, last)
	}
}

// With a PageSize above the API's bound of 1000, a listing that names no
// limit gets the most it may have, not a 400 for a limit it did not give.
func TestAPIDefaultLimitWithinBound(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 3, 0)
	srv := serve(t, b, dashboard.Options{PageSize: 5000})
	code, body := get(t, http.DefaultClient, srv.URL+"/api/queues/billing/dead-letters")
	if code != 200 || !strings.Contains(body, `"limit":1000`) || strings.Count(body, `"dead_letter":`) != 3 {
		t.Fatalf("no limit: %d %s", code, body)
	}
	if code, _ := get(t, http.DefaultClient, srv.URL+"/api/queues/billing/dead-letters?limit=1001"); code != 400 {
		t.Errorf("limit 1001: %d, want 400", code)
	}
	if code, _ := get(t, http.DefaultClient, srv.URL+"/queues/billing"); code != 200 {
		t.Errorf("queue page: %d", code)
	}
}

// A change that names IDs and also asks for "all" is refused: it is not
// widened from the IDs to every dead letter of the queue.
func TestAPIChangeIDsAndAllRefused(t *testing.T) {
	b := memoryBroker(t)
	ids := seed(t, b, 3, 0)
	srv := serve(t, b, dashboard.Options{})
	code, body := post(t, mustReq("POST", srv.URL+"/api/queues/billing/purge", "application/json", `{"ids":["`+ids[0]+`"],"all":true}`))
	if code != http.StatusBadRequest {
		t.Errorf("ids and all: %d %s, want 400", code, body)
	}
	if st := stats(t, b); st.DeadLettered != 3 {
		t.Errorf("a refused purge of one ID changed %d dead letters", 3-st.DeadLettered)
	}
}
