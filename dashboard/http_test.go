package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestToken(t *testing.T) {
	b := memoryBroker(t)
	srv := serve(t, b, dashboard.Options{Token: testToken})
	if code, _ := get(t, http.DefaultClient, srv.URL+"/"); code != http.StatusUnauthorized {
		t.Fatalf("no token: %d", code)
	}
	for _, set := range []func(*http.Request){
		func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+testToken) },
		func(r *http.Request) { r.SetBasicAuth("ops", testToken) },
	} {
		req, _ := http.NewRequest("GET", srv.URL+"/api/queues", nil)
		set(req)
		if code, body := post(t, req); code != http.StatusOK || !strings.Contains(body, `"queues"`) {
			t.Fatalf("with token: %d %s", code, body)
		}
	}
	req, _ := http.NewRequest("GET", srv.URL+"/api/queues", nil)
	req.Header.Set("Authorization", "Bearer s3cre")
	if code, _ := post(t, req); code != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", code)
	}
}

func TestReadOnly(t *testing.T) {
	b := memoryBroker(t)
	ids := seed(t, b, 3, 0)
	srv := serve(t, b, dashboard.Options{ReadOnly: true})
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing")
	if code != 200 || strings.Contains(page, `id="redrive"`) || strings.Contains(page, `name="id"`) || !strings.Contains(page, "read-only") {
		t.Fatalf("read-only page shows changes (%d)", code)
	}
	if code, _ := get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?action=redrive&all=1"); code != http.StatusForbidden {
		t.Fatalf("confirm: %d", code)
	}
	form := url.Values{"id": {ids[0]}, "limit": {"1"}}
	if code, _ := post(t, mustReq("POST", srv.URL+"/queues/billing/redrive", "application/x-www-form-urlencoded", form.Encode())); code != http.StatusForbidden {
		t.Fatalf("form post: %d", code)
	}
	if code, _ := post(t, mustReq("POST", srv.URL+"/api/queues/billing/purge", "application/json", `{"all":true}`)); code != http.StatusForbidden {
		t.Fatalf("api post: %d", code)
	}
	if st := stats(t, b); st.DeadLettered != 3 {
		t.Fatalf("read-only changed something: %+v", st)
	}
}

func mustReq(method, u, ctype, body string) *http.Request {
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", ctype)
	return req
}

// A cross-site POST (another page in the operator's browser) is refused.
func TestCrossOriginPostRefused(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 2, 0)
	srv := serve(t, b, dashboard.Options{})
	form := url.Values{"all": {"1"}, "limit": {"2"}}
	req := mustReq("POST", srv.URL+"/queues/billing/purge", "application/x-www-form-urlencoded", form.Encode())
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.Header.Set("Origin", "https://evil.example")
	if code, _ := post(t, req); code != http.StatusForbidden {
		t.Fatalf("cross-site post: %d", code)
	}
	req = mustReq("POST", srv.URL+"/queues/billing/purge", "application/x-www-form-urlencoded", form.Encode())
	req.Header.Set("Origin", "https://evil.example")
	if code, _ := post(t, req); code != http.StatusForbidden {
		t.Fatalf("post from another origin: %d", code)
	}
	if st := stats(t, b); st.DeadLettered != 2 {
		t.Fatalf("a refused post changed something: %+v", st)
	}
	// The same POST from the dashboard's own origin works.
	req = mustReq("POST", srv.URL+"/queues/billing/purge", "application/x-www-form-urlencoded", form.Encode())
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.Header.Set("Origin", srv.URL)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "result=") {
		t.Fatalf("same-origin post: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if _, page := get(t, http.DefaultClient, srv.URL+resp.Header.Get("Location")); !strings.Contains(page, "purged 2 dead letter(s)") {
		t.Fatalf("same-origin post: the page it redirects to does not say what it did:\n%s", page)
	}
	if st := stats(t, b); st.DeadLettered != 0 {
		t.Fatalf("after purge: %+v", st)
	}
}

func TestAPI(t *testing.T) {
	b := memoryBroker(t)
	ids := seed(t, b, 9, 2)
	srv := serve(t, b, dashboard.Options{PageSize: 4})
	code, body := get(t, http.DefaultClient, srv.URL+"/api/queues/billing/dead-letters?class=permanent&limit=2&offset=2")
	var l struct {
		Matched    int  `json:"matched"`
		Total      int  `json:"total_dead_letters"`
		NextOffset *int `json:"next_offset"`
		Messages   []struct {
			ID         string `json:"id"`
			DeadLetter struct {
				Class string `json:"class"`
			} `json:"dead_letter"`
		} `json:"messages"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &l) != nil || l.Matched != 6 || l.Total != 9 || len(l.Messages) != 2 || *l.NextOffset != 4 || l.Messages[0].ID != ids[4] {
		t.Fatalf("list: %d %s", code, body)
	}
	if code, body := get(t, http.DefaultClient, srv.URL+"/api/queues/billing/dead-letters/"+ids[0]); code != 200 || !strings.Contains(body, `"class":"transient"`) {
		t.Fatalf("one: %d %s", code, body)
	}
	if code, _ := get(t, http.DefaultClient, srv.URL+"/api/queues/billing/dead-letters/nope"); code != 404 {
		t.Fatalf("missing: %d", code)
	}
	if code, body := get(t, http.DefaultClient, srv.URL+"/api/queues/billing/dead-letters?older_than=soon"); code != 400 || !strings.Contains(body, "older than") {
		t.Fatalf("bad filter: %d %s", code, body)
	}
	// A change needs ids or "all": true.
	if code, _ := post(t, mustReq("POST", srv.URL+"/api/queues/billing/redrive", "application/json", `{}`)); code != 400 {
		t.Fatalf("empty change: %d", code)
	}
	code, body = post(t, mustReq("POST", srv.URL+"/api/queues/billing/redrive", "application/json", `{"all":true,"reason":"timeout","dry_run":true}`))
	if code != 200 || !strings.Contains(body, `"matched":3`) || !strings.Contains(body, `"done":0`) || stats(t, b).DeadLettered != 9 {
		t.Fatalf("dry run: %d %s", code, body)
	}
	code, body = post(t, mustReq("POST", srv.URL+"/api/queues/billing/redrive", "application/json", `{"ids":["`+ids[1]+`","gone"]}`))
	if code != 200 || !strings.Contains(body, `"done":1`) || !strings.Contains(body, `"missed":1`) || !strings.Contains(body, `"id":"gone"`) {
		t.Fatalf("redrive ids: %d %s", code, body)
	}
	code, body = post(t, mustReq("POST", srv.URL+"/api/queues/billing/purge", "application/json", `{"all":true,"type":"billing.refund"}`))
	if code != 200 || !strings.Contains(body, `"done":2`) {
		t.Fatalf("purge refunds: %d %s", code, body)
	}
	if st := stats(t, b); st.DeadLettered != 6 || st.Ready != 3 {
		t.Fatalf("after: %+v", st)
	}
}

// vanishing lists a queue that is deleted before its Stats are read.
type vanishing struct{ broker }

func (v vanishing) Queues(ctx context.Context) ([]string, error) {
	qs, err := v.broker.(dlq.QueueLister).Queues(ctx)
	return append(qs, "gone"), err
}

func (v vanishing) Stats(ctx context.Context, q string) (sdk.QueueStats, error) {
	if q == "gone" {
		return sdk.QueueStats{}, fmt.Errorf("%w: queue gone", sdk.ErrNotFound)
	}
	return v.broker.Stats(ctx, q)
}

// TestQueueDeletedMeanwhile: the overview leaves out a queue the broker
// listed and deleted before its Stats were read, instead of failing the
// whole page; a queue the operator configured is still reported.
func TestQueueDeletedMeanwhile(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 1, 0)
	srv := serve(t, vanishing{b}, dashboard.Options{})
	for _, path := range []string{"/", "/api/queues"} {
		if code, body := get(t, http.DefaultClient, srv.URL+path); code != 200 || !strings.Contains(body, "billing") || strings.Contains(body, "gone") {
			t.Errorf("%s: %d %s", path, code, body)
		}
	}
	srv = serve(t, vanishing{b}, dashboard.Options{Queues: []string{"gone"}})
	if code, body := get(t, http.DefaultClient, srv.URL+"/api/queues"); code == 200 {
		t.Errorf("a configured queue that is missing: %d %s", code, body)
	}
	pauses := pauseTable(t)
	if _, err := pauses.Pause(t.Context(), "gone"); err != nil {
		t.Fatal(err)
	}
	srv = serve(t, vanishing{b}, dashboard.Options{Pauses: pauses})
	if code, body := get(t, http.DefaultClient, srv.URL+"/api/queues"); code == 200 {
		t.Errorf("a paused queue that is missing: %d %s", code, body)
	}
}

// Message text reaches the page escaped: HTML by html/template, control
// characters as visible escapes.
func TestEscaping(t *testing.T) {
	ctx := context.Background()
	b := memoryBroker(t)
	m := &sdk.Message{Type: "billing.charge", Body: []byte(`<script>alert(1)</script>` + "\x1b[2J"),
		Headers: map[string]string{"note": `"><img src=x onerror=alert(1)>` + "\x1b]0;t\x07"}}
	if err := b.Publish(ctx, "billing", m); err != nil {
		t.Fatal(err)
	}
	ds, _ := b.Receive(ctx, "billing", 1)
	_ = ds[0].DeadLetter(ctx, errors.New("<b>bold</b> \x1b[31mred"))
	srv := serve(t, b, dashboard.Options{})
	for _, path := range []string{"/queues/billing", "/queues/billing/messages/" + m.ID} {
		code, page := get(t, http.DefaultClient, srv.URL+path)
		if code != 200 {
			t.Fatalf("%s: %d", path, code)
		}
		for _, raw := range []string{"<script>alert", "<img src=x", "<b>bold", "\x1b", "\x07"} {
			if strings.Contains(page, raw) {
				t.Errorf("%s has %q raw", path, raw)
			}
		}
		if !strings.Contains(page, `&lt;b&gt;bold&lt;/b&gt; \x1b[31mred`) {
			t.Errorf("%s: the reason is not shown escaped", path)
		}
	}
	_, page := get(t, http.DefaultClient, srv.URL+"/queues/billing/messages/"+m.ID)
	if !strings.Contains(page, `&lt;script&gt;alert(1)&lt;/script&gt;\x1b[2J`) {
		t.Errorf("body not shown escaped")
	}
}

func TestNoDeadLetters(t *testing.T) {
	if _, err := dashboard.New(publishOnly{}, dashboard.Options{}); !errors.Is(err, dashboard.ErrNoDeadLetters) {
		t.Fatal(err)
	}
}

type publishOnly struct{ sdk.Broker }

// The JSON API carries message text exactly, but encoding/json writes C1
// controls (U+009B is CSI to a terminal: a curl of the API) and
// bidirectional-text controls as they are. They must be \u escapes.
func TestAPIEscapesTerminalControls(t *testing.T) {
	ctx := context.Background()
	b := memoryBroker(t)
	const evil = "a\u202eevil\u2066\u009b31m\u0085\x7fz"
	m := &sdk.Message{Type: "billing." + evil, Body: []byte("body " + evil), Headers: map[string]string{"note": evil}}
	if err := b.Publish(ctx, "billing", m); err != nil {
		t.Fatal(err)
	}
	ds, _ := b.Receive(ctx, "billing", 1)
	if err := ds[0].DeadLetter(ctx, errors.New("bad input: "+evil)); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, b, dashboard.Options{})
	for _, path := range []string{"/api/queues/billing/dead-letters", "/api/queues/billing/dead-letters/" + m.ID} {
		code, body := get(t, http.DefaultClient, srv.URL+path)
		if code != 200 {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		for _, raw := range []string{"\u202e", "\u2066", "\u009b", "\u0085", "\x7f"} {
			if strings.Contains(body, raw) {
				t.Errorf("%s has %q raw", path, raw)
			}
		}
		var v struct {
			Headers  map[string]string `json:"headers"`
			Messages []struct {
				Headers map[string]string `json:"headers"`
			} `json:"messages"`
		}
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatalf("%s: not JSON: %v", path, err)
		}
		if len(v.Messages) == 1 {
			v.Headers = v.Messages[0].Headers
		}
		if v.Headers["note"] != evil {
			t.Errorf("%s: the text is not carried exactly: %q", path, v.Headers["note"])
		}
	}
}
