package dashboard_test

import (
	"context"
	"errors"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// follow returns the page a browser shows for a link href on a page of
// srv: it resolves the link against the page's URL, dot segments and all,
// as browsers do (RFC 3986), then follows redirects.
func follow(t *testing.T, srv string, from, href string) (int, string, string) {
	t.Helper()
	base, err := url.Parse(srv + from)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := url.Parse(html.UnescapeString(href))
	if err != nil {
		t.Fatalf("link %q: %v", href, err)
	}
	u := base.ResolveReference(ref)
	code, body := get(t, http.DefaultClient, u.String())
	return code, body, u.RequestURI()
}

// heading is the <h1 class="mono"> of a page: the ID of a message or job.
func heading(page string) string {
	_, h, _ := strings.Cut(page, `<h1 class="mono">`)
	h, _, _ = strings.Cut(h, "</h1>")
	return h
}

// A dead letter whose ID is "." or ".." (a raw AMQP message-id from a
// producer outside berth can be anything) has a link that shows it. Before,
// its link was /queues/billing/messages/.., which a browser (and
// http.ServeMux, escaped or not) resolves to /queues/billing/: not found.
func TestDotIDMessageLinks(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	ctx := context.Background()
	// "/" is a path segment of its own too: http.ServeMux takes the
	// segment %2F for a trailing slash, which no {id} matches.
	ids := []string{".", "..", "...", "/"}
	for _, id := range ids {
		if err := mb.Publish(ctx, "billing", &sdk.Message{ID: id, Type: "t", Body: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		ds, _ := mb.Receive(ctx, "billing", 1)
		_ = ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("declined")))
	}
	srv := serve(t, mb, dashboard.Options{})
	_, page := get(t, http.DefaultClient, srv.URL+"/queues/billing")
	links := regexp.MustCompile(`<td class="mono"><a href="([^"]*)">([^<]*)</a>`).FindAllStringSubmatch(page, -1)
	if len(links) != len(ids) {
		t.Fatalf("%d message links on the queue page, want %d", len(links), len(ids))
	}
	for _, l := range links {
		code, body, at := follow(t, srv.URL, "/queues/billing", l[1])
		if code != 200 || heading(body) != l[2] {
			t.Errorf("the link of dead letter %q (%s) leads to %s: %d, showing %q", l[2], l[1], at, code, heading(body))
		}
	}
	if code, _ := get(t, http.DefaultClient, srv.URL+"/queues/billing/message"); code != http.StatusBadRequest {
		t.Errorf("the page by query without an id: %d, want 400", code)
	}
}

// dotJobs is a ledger whose one job has the ID id ("..", when empty), and
// key "k".
type dotJobs struct {
	ledger.Reader
	id string
}

func (d dotJobs) jobID() string {
	if d.id == "" {
		return ".."
	}
	return d.id
}

func (d dotJobs) Job(_ context.Context, id string) (*ledger.Job, error) {
	if id != d.jobID() {
		return nil, sdk.ErrNotFound
	}
	return &ledger.Job{MessageID: id, Queue: "billing", Type: "t", Status: ledger.StatusDead, IdempotencyKey: "k"}, nil
}

func (d dotJobs) JobByKey(ctx context.Context, key string) (*ledger.Job, error) {
	if key != "k" {
		return nil, sdk.ErrNotFound
	}
	return d.Job(ctx, d.jobID())
}

func (d dotJobs) List(ctx context.Context, _ ledger.Filter) (ledger.Page, error) {
	j, _ := d.Job(ctx, d.jobID())
	return ledger.Page{Jobs: []ledger.Job{*j}}, nil
}

// A job whose ID is ".." is reached from the jobs list, by its ID and by its
// key. Before, each led to /jobs/.., which is the overview. The same for a
// job whose ID is "/": /jobs/%2F is not found (http.ServeMux takes %2F for a
// trailing slash).
func TestDotIDJobLinks(t *testing.T) {
	for _, id := range []string{"..", "/"} {
		mb, _ := memory.New(memory.Options{})
		t.Cleanup(func() { mb.Close() })
		srv := serve(t, mb, dashboard.Options{Jobs: dotJobs{id: id}})
		_, list := get(t, http.DefaultClient, srv.URL+"/jobs")
		m := regexp.MustCompile(`<td class="mono"><a href="([^"]*)">`).FindStringSubmatch(list)
		if m == nil {
			t.Fatal("no job link on the jobs page")
		}
		for _, href := range []string{m[1], "/jobs?id=" + url.QueryEscape(id), "/jobs?key=k"} {
			code, body, at := follow(t, srv.URL, "/jobs", href)
			if code != 200 || heading(body) != id || !strings.Contains(body, `id="job-status"`) {
				t.Errorf("%s leads to %s: %d, showing %q, not job %s", href, at, code, heading(body), id)
			}
		}
	}
}

// The API reads a dead letter and a job by an ID in the query, which "."
// and ".." need (clients resolve them in a path, as the dashboard's
// ServeMux does).
func TestDotIDAPI(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	ctx := context.Background()
	if err := mb.Publish(ctx, "billing", &sdk.Message{ID: "..", Type: "t", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	ds, _ := mb.Receive(ctx, "billing", 1)
	_ = ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("declined")))
	srv := serve(t, mb, dashboard.Options{Jobs: dotJobs{}})
	for _, path := range []string{"/api/queues/billing/dead-letter?id=..", "/api/job?id=.."} {
		code, body := get(t, http.DefaultClient, srv.URL+path)
		if code != 200 || !strings.Contains(body, `"..`) {
			t.Errorf("%s: %d %s", path, code, body)
		}
	}
	for _, path := range []string{"/api/queues/billing/dead-letter", "/api/job?id="} {
		if code, body := get(t, http.DefaultClient, srv.URL+path); code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", path, code, body)
		}
	}
}
