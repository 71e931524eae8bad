package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// Characters that show as nothing — a zero-width space, a BOM, a soft
// hyphen, tag characters that spell hidden text, a Hangul filler — are
// shown as escapes on the pages and written as \u escapes by the API: an
// ID with one looks like another ID, and a reason can hide words. Before,
// only control characters and bidi overrides were.
func TestInvisibleCharactersShown(t *testing.T) {
	const hidden = "\u200b\ufeff\u00ad\U000e0041\U000e0042\u3164"
	ctx := context.Background()
	b := memoryBroker(t)
	m := &sdk.Message{ID: "job-1\u200b", Type: "billing.charge\U000e0041\U000e0042", Body: []byte(`{}`)}
	if err := b.Publish(ctx, "billing", m); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "billing", 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %d %v", len(ds), err)
	}
	if err := ds[0].DeadLetter(ctx, errors.New("card\ufeff declined\u00ad\u3164")); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, b, dashboard.Options{})

	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing/messages/"+url.PathEscape(m.ID))
	if code != 200 {
		t.Fatalf("message page: %d", code)
	}
	h1 := regexp.MustCompile(`<h1 class="mono">([^<]*)</h1>`).FindStringSubmatch(page)
	if h1 == nil || h1[1] != `job-1\u200b` {
		t.Errorf("message page heading %q, want the ID with its zero-width space escaped", h1)
	}
	// Every shown text: what is between tags (attributes carry the exact ID
	// back to the server and are not shown).
	text := regexp.MustCompile(`<[^>]*>`).ReplaceAllString(page, "")
	if strings.ContainsAny(text, hidden) {
		t.Errorf("message page shows invisible characters raw: %q", text)
	}
	code, page = get(t, http.DefaultClient, srv.URL+"/queues/billing")
	if code != 200 {
		t.Fatalf("queue page: %d", code)
	}
	if text := regexp.MustCompile(`<[^>]*>`).ReplaceAllString(page, ""); strings.ContainsAny(text, hidden) ||
		!strings.Contains(text, `job-1\u200b`) {
		t.Errorf("queue page shows invisible characters raw, or not as escapes: %q", text)
	}

	code, body := get(t, http.DefaultClient, srv.URL+"/api/queues/billing/dead-letters/"+url.PathEscape(m.ID))
	if code != 200 {
		t.Fatalf("API: %d %s", code, body)
	}
	if strings.ContainsAny(body, hidden) {
		t.Errorf("API writes invisible characters raw: %q", body)
	}
	var v struct{ ID, Type string }
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.ID != m.ID || v.Type != m.Type {
		t.Errorf("API document decodes to %+q (%v), not the message's ID and type", v, err)
	}
}

// A backslash in shown text is shown as \\, so that the escapes of
// invisible characters cannot be forged: an ID spelt with the six
// characters \u200b shows as job-1\\u200b, not like the ID with a
// zero-width space. A JSON body is shown as JSON, its backslashes as they
// are. Before, both IDs showed as job-1\u200b.
func TestBackslashShownEscaped(t *testing.T) {
	ctx := context.Background()
	b := memoryBroker(t)
	m := &sdk.Message{ID: `job-1\u200b`, Type: "billing.charge", Body: []byte(`{"path":"C:\\dir"}`)}
	if err := b.Publish(ctx, "billing", m); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "billing", 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %d %v", len(ds), err)
	}
	if err := ds[0].DeadLetter(ctx, errors.New(`bad \x1b`)); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, b, dashboard.Options{})
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing/messages/"+url.PathEscape(m.ID))
	if code != 200 {
		t.Fatalf("message page: %d", code)
	}
	h1 := regexp.MustCompile(`<h1 class="mono">([^<]*)</h1>`).FindStringSubmatch(page)
	if h1 == nil || h1[1] != `job-1\\u200b` {
		t.Errorf("message page heading %q, want job-1\\\\u200b", h1)
	}
	text := html.UnescapeString(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(page, ""))
	if !strings.Contains(text, `bad \\x1b`) || !strings.Contains(text, `"path": "C:\\dir"`) {
		t.Errorf("message page: want the reason as bad \\\\x1b and the JSON body as it is: %q", text)
	}
}
