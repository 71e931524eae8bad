package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// lostOnSecond is a memory broker whose second RedriveDeadLetters call
// fails, as a broker connection lost during a redrive does.
type lostOnSecond struct {
	*memory.Broker
	calls atomic.Int32
}

func (f *lostOnSecond) RedriveDeadLetters(ctx context.Context, q string, ids ...string) (int, error) {
	if f.calls.Add(1) >= 2 {
		return 0, errors.New("broker connection lost")
	}
	return f.Broker.RedriveDeadLetters(ctx, q, ids...)
}

// syncBuffer is a bytes.Buffer safe for a server's goroutines.
type syncBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{mu: make(chan struct{}, 1)} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.String()
}

// A redrive that fails part-way says, on the page, in the API's answer and
// in the log, how many dead letters it redrove before the error.
func TestChangeStoppedPartWay(t *testing.T) {
	for _, api := range []bool{false, true} {
		mb, _ := memory.New(memory.Options{})
		t.Cleanup(func() { mb.Close() })
		seed(t, mb, 502, 0) // Apply moves 500 a page: two pages, the second fails
		logs := newSyncBuffer()
		srv := serve(t, &lostOnSecond{Broker: mb}, dashboard.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
		var code int
		var body string
		if api {
			code, body = post(t, mustReq("POST", srv.URL+"/api/queues/billing/redrive", "application/json", `{"all":true,"limit":502}`))
		} else {
			form := url.Values{"all": {"1"}, "limit": {"502"}}
			code, body = post(t, mustReq("POST", srv.URL+"/queues/billing/redrive", "application/x-www-form-urlencoded", form.Encode()))
		}
		if left := stats(t, mb).DeadLettered; left != 2 {
			t.Fatalf("api %v: %d dead letters left, want 2", api, left)
		}
		if code != http.StatusInternalServerError {
			t.Errorf("api %v: status %d, want 500", api, code)
		}
		if api {
			var v struct {
				Done  *int   `json:"done"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &v); err != nil || v.Done == nil || *v.Done != 500 || !strings.Contains(v.Error, "connection lost") {
				t.Errorf("API answer %s: want done 500 and the error", strings.TrimSpace(body))
			}
		} else {
			_, msg, _ := strings.Cut(body, `id="error">`)
			msg, _, _ = strings.Cut(msg, "</p>")
			if !strings.Contains(msg, "redriven 500 dead letter(s) before the error") || !strings.Contains(msg, "connection lost") {
				t.Errorf("page says %q; 500 were redriven before the error", msg)
			}
		}
		if l := logs.String(); !strings.Contains(l, "done=500") || !strings.Contains(l, "connection lost") {
			t.Errorf("api %v: the log does not say 500 were redriven before the error:\n%s", api, l)
		}
	}
}

// hostileHeaders is a memory broker whose dead letters carry reserved
// headers with control characters and bidi overrides, as a producer
// publishing straight to a RabbitMQ .dlq can send.
type hostileHeaders struct{ *memory.Broker }

func (r hostileHeaders) DeadLetterPage(ctx context.Context, q, cursor string, limit int) ([]*sdk.Message, string, error) {
	ms, next, err := r.Broker.DeadLetterPage(ctx, q, cursor, limit)
	return hostile(ms), next, err
}

func (r hostileHeaders) DeadLetterPageTo(ctx context.Context, q, cursor, mark string, limit int) ([]*sdk.Message, string, error) {
	ms, next, err := r.Broker.DeadLetterPageTo(ctx, q, cursor, mark, limit)
	return hostile(ms), next, err
}

func hostile(ms []*sdk.Message) []*sdk.Message {
	for _, m := range ms {
		m.Headers[sdk.HeaderDeadLetterAttempts] = "3\u202e\x1b]8;;x\x07"
		m.Headers[sdk.HeaderLastFailure] = "\u202eevil\x1b[2J"
	}
	return ms
}

// Header text on the queue page shows control characters as escapes.
func TestQueuePageEscapesHeaders(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	seed(t, mb, 1, 0)
	srv := serve(t, hostileHeaders{mb}, dashboard.Options{})
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	for _, bad := range []string{"\u202e", "\x1b", "\x07"} {
		if i := strings.Index(page, bad); i >= 0 {
			t.Errorf("queue page carries %q unescaped: %q", bad, page[max(0, i-60):min(len(page), i+20)])
		}
	}
	if !strings.Contains(page, `<td class="n">3\u202e\x1b]8;;x\a</td>`) || !strings.Contains(page, `title="\u202eevil\x1b[2J"`) {
		t.Errorf("the headers are not shown as escapes")
	}
}

// oneJob is a ledger with one job, whose error class came from a hostile
// berth-dlq-class header.
type oneJob struct{ ledger.Reader }

func (oneJob) Job(_ context.Context, id string) (*ledger.Job, error) {
	if id != "job/1?x#y" {
		return nil, sdk.ErrNotFound
	}
	return &ledger.Job{MessageID: id, Queue: "billing", Type: "t", Status: ledger.Status("dead"),
		LastError: "declined", ErrorClass: sdk.ErrorClass("perm\u202eanent\x1b[31m")}, nil
}

func (oneJob) List(context.Context, ledger.Filter) (ledger.Page, error) {
	j, _ := oneJob{}.Job(context.Background(), "job/1?x#y")
	return ledger.Page{Jobs: []ledger.Job{*j}}, nil
}

// The job page escapes the error class; the jobs list links to a job by
// its path-escaped ID, which the job page decodes.
func TestJobPageEscapesAndLinks(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	srv := serve(t, mb, dashboard.Options{Jobs: oneJob{}})
	_, list := get(t, http.DefaultClient, srv.URL+"/jobs")
	const link = `href="/jobs/job%2f1%3fx%23y"`
	if !strings.Contains(strings.ToLower(list), link) {
		_, a, _ := strings.Cut(list, `<td class="mono"><a `)
		a, _, _ = strings.Cut(a, ">")
		t.Errorf("jobs list links with %s, want %s", a, link)
	}
	code, page := get(t, http.DefaultClient, srv.URL+"/jobs/job%2F1%3Fx%23y")
	if code != 200 || !strings.Contains(page, "job/1?x#y") {
		t.Fatalf("following the link: %d %s", code, page)
	}
	for _, bad := range []string{"\u202e", "\x1b"} {
		if i := strings.Index(page, bad); i >= 0 {
			t.Errorf("job page carries %q unescaped: %q", bad, page[max(0, i-60):min(len(page), i+20)])
		}
	}
	if !strings.Contains(page, `perm\u202eanent\x1b[31m`) {
		t.Errorf("the error class is not shown as escapes")
	}
}

// A dead letter's link escapes its ID as a path segment, and following it
// shows that dead letter, not another.
func TestMessageLinkPathEscaped(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	ctx := context.Background()
	ids := []string{"order-7", "order-7?view=x", "order-7#top", "a/b", "50%"}
	for _, id := range ids {
		if err := mb.Publish(ctx, "billing", &sdk.Message{ID: id, Type: "t", Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
		ds, _ := mb.Receive(ctx, "billing", 1)
		_ = ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("reason of "+id)))
	}
	srv := serve(t, mb, dashboard.Options{})
	_, page := get(t, http.DefaultClient, srv.URL+"/queues/billing")
	for _, id := range ids {
		href := "/queues/billing/messages/" + url.PathEscape(id)
		if !strings.Contains(page, `href="`+href+`"`) {
			t.Errorf("no link %s for %q", href, id)
			continue
		}
		code, body := get(t, http.DefaultClient, srv.URL+href)
		_, shown, _ := strings.Cut(body, `<h1 class="mono">`)
		shown, _, _ = strings.Cut(shown, "</h1>")
		if code != 200 || shown != template(id) {
			t.Errorf("following %s: %d, shows %q, want %q", href, code, shown, id)
		}
	}
}

// template is s as html/template writes it in text.
func template(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(s)
}

// Without a ledger, the job pages name the flag of berth ui that adds one
// (-db), not one that does not exist.
func TestNoLedgerNamesTheFlag(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	srv := serve(t, mb, dashboard.Options{})
	for _, path := range []string{"/jobs", "/api/jobs"} {
		code, body := get(t, http.DefaultClient, srv.URL+path)
		if code != http.StatusNotFound || strings.Contains(body, "-ledger") || !strings.Contains(body, "berth ui -db") {
			t.Errorf("%s: %d %s", path, code, body)
		}
	}
}

// refusesOne is a memory broker whose redrive refuses one chosen dead
// letter (the broker's reason names it) and fails the call with a
// PublishError after moving the others, as SQS and JetStream do when a
// send is refused.
type refusesOne struct {
	*memory.Broker
	refuse string
}

func (f *refusesOne) RedriveDeadLetters(ctx context.Context, q string, ids ...string) (int, error) {
	var rest []string
	for _, id := range ids {
		if id != f.refuse {
			rest = append(rest, id)
		}
	}
	n, err := f.Broker.RedriveDeadLetters(ctx, q, rest...)
	if err != nil || len(rest) == len(ids) {
		return n, err
	}
	return n, &sdk.PublishError{Failed: map[string]error{f.refuse: errors.New("queue full: \x1b[31mrefused")}}
}

// A change the broker refused in part says which letter it did not change
// and why, not "gone already", and does not claim that nothing else was
// changed; the log names it too.
func TestChangeRefusedInPartNamesTheFailure(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	seed(t, mb, 5, 0)
	dls, err := mb.ListDeadLetters(context.Background(), "billing", 10)
	if err != nil || len(dls) != 5 {
		t.Fatalf("ListDeadLetters: %d, %v", len(dls), err)
	}
	logs := newSyncBuffer()
	srv := serve(t, &refusesOne{Broker: mb, refuse: dls[2].ID}, dashboard.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	form := url.Values{"all": {"1"}, "limit": {"5"}}
	_, body := post(t, mustReq("POST", srv.URL+"/queues/billing/redrive", "application/x-www-form-urlencoded", form.Encode()))
	if left := stats(t, mb).DeadLettered; left != 1 {
		t.Fatalf("%d dead letters left, want the refused one", left)
	}
	_, msg, _ := strings.Cut(body, `id="error">`)
	msg, _, _ = strings.Cut(msg, "</p>")
	if !strings.Contains(msg, "redriven 4 dead letter(s) before the error") || !strings.Contains(msg, dls[2].ID+": queue full") {
		t.Errorf("page says %q; want 4 redriven and %s named with its reason", msg, dls[2].ID)
	}
	if strings.Contains(msg, "gone already") || strings.Contains(msg, "nothing else was changed") || strings.Contains(msg, "\x1b") {
		t.Errorf("page says %q: a refusal is not 'gone already', and raw control characters must not reach the page", msg)
	}
	if l := logs.String(); !strings.Contains(l, "dead letter not changed") || !strings.Contains(l, dls[2].ID) {
		t.Errorf("the log does not name the refused dead letter:\n%s", l)
	}
}
