package dashboard

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// The job-state pages, read from Options.Jobs (package ledger). They are
// the extension point for more job views: each is a handler here, a
// template and a route in New.

type jobsPage struct {
	Filter   ledger.Filter
	Statuses []ledger.Status
	Status   string
	Page     ledger.Page
	Query    url.Values
}

func (d *Dashboard) jobsFilter(q url.Values) (ledger.Filter, error) {
	f := ledger.Filter{Queue: q.Get("queue"), Type: q.Get("type"), After: q.Get("after"), Limit: d.o.PageSize}
	if s := q.Get("status"); s != "" {
		if !ledger.Status(s).Valid() {
			return f, &badRequest{fmt.Sprintf("status: want one of %v", ledger.Statuses)}
		}
		f.Statuses = []ledger.Status{ledger.Status(s)}
	}
	return f, nil
}

func (d *Dashboard) jobs(w http.ResponseWriter, r *http.Request) {
	if d.o.Jobs == nil {
		d.fail(w, r, fmt.Errorf("%w", errNoLedgerFound))
		return
	}
	q := r.URL.Query()
	// Look one job up by ID or idempotency key.
	if id := q.Get("id"); id != "" {
		if notSegment(id) { // no /jobs/ID reaches it: show it here
			d.showJob(w, r, id)
			return
		}
		http.Redirect(w, r, jobURL(id), http.StatusSeeOther)
		return
	}
	if key := q.Get("key"); key != "" {
		j, err := d.o.Jobs.JobByKey(r.Context(), key)
		if err != nil {
			d.fail(w, r, err)
			return
		}
		http.Redirect(w, r, jobURL(j.MessageID), http.StatusSeeOther)
		return
	}
	f, err := d.jobsFilter(q)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	p, err := d.o.Jobs.List(r.Context(), f)
	if err != nil {
		d.fail(w, r, asBadFilter(err))
		return
	}
	next := url.Values{}
	for k, v := range q {
		next[k] = slices.Clone(v)
	}
	next.Set("after", p.Next)
	d.render(w, "jobs", http.StatusOK, jobsPage{Filter: f, Statuses: ledger.Statuses, Status: q.Get("status"), Page: p, Query: next})
}

func asBadFilter(err error) error {
	if errors.Is(err, ledger.ErrInvalidFilter) {
		return &badRequest{err.Error()}
	}
	return err
}

func (d *Dashboard) job(w http.ResponseWriter, r *http.Request) {
	if d.o.Jobs == nil {
		d.fail(w, r, errNoLedgerFound)
		return
	}
	d.showJob(w, r, r.PathValue("id"))
}

// showJob renders the page of job id.
func (d *Dashboard) showJob(w http.ResponseWriter, r *http.Request, id string) {
	j, err := d.o.Jobs.Job(r.Context(), id)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	d.render(w, "job", http.StatusOK, j)
}

func (d *Dashboard) apiJobs(w http.ResponseWriter, r *http.Request) {
	if d.o.Jobs == nil {
		d.apiFail(w, r, errNoLedgerFound)
		return
	}
	f, err := d.jobsFilter(r.URL.Query())
	if err != nil {
		d.apiFail(w, r, err)
		return
	}
	p, err := d.o.Jobs.List(r.Context(), f)
	if err != nil {
		d.apiFail(w, r, asBadFilter(err))
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func (d *Dashboard) apiJob(w http.ResponseWriter, r *http.Request) {
	if d.o.Jobs == nil {
		d.apiFail(w, r, errNoLedgerFound)
		return
	}
	id, err := idOf(r)
	if err != nil {
		d.apiFail(w, r, err)
		return
	}
	j, err := d.o.Jobs.Job(r.Context(), id)
	if err != nil {
		d.apiFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, j)
}

// errNoLedgerFound is a 404: the pages exist only with a ledger.
var errNoLedgerFound = fmt.Errorf("%w: %w", errNoLedger, sdk.ErrNotFound)
