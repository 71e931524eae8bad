package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// A dead letter whose body is long is shown cut, saying so, in a page of
// bounded size, while the API still gives the whole body. Before, the page
// showed the whole body: 4 MiB of "<" became a 16 MiB page ("&lt;"), and
// 4 MiB of binary a 20 MiB hex dump, each built in memory per request
// (RabbitMQ takes bodies of 16 MiB by default).
func TestLongBodyIsShownCut(t *testing.T) {
	const size = 4 << 20
	for _, c := range []struct {
		name string
		body []byte
		kind string
		id   string // the message's ID; "" for one berth makes
	}{
		{"text", bytes.Repeat([]byte("<"), size), "text", ""},
		{"binary", bytes.Repeat([]byte{0xff, 0x00}, size/2), "hex", ""},
		// A cut in the middle of a character still shows text.
		{"utf8", append([]byte("x"), bytes.Repeat([]byte("é"), size/2)...), "text", ""},
		// The page's link to the whole body works for an ID that cannot
		// be a path segment (see TestDotIDMessageLinks).
		{"dot ID", bytes.Repeat([]byte("a"), size), "text", ".."},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := memory.New(memory.Options{MaxMessageSize: -1}) // as RabbitMQ's 16 MiB, or more
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			m := &sdk.Message{ID: c.id, Type: "big", Body: c.body}
			deadLetterOne(t, b, m)
			d, err := dashboard.New(b, dashboard.Options{})
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			d.ServeHTTP(rec, httptest.NewRequest("GET", "/queues/billing/message?id="+url.QueryEscape(m.ID), nil))
			page := rec.Body.String()
			if rec.Code != 200 {
				t.Fatalf("%d %.500s", rec.Code, page)
			}
			if len(page) > 6<<20 { // 1 MiB shown: at most about 5 MiB of page (each "<" as "&lt;")
				t.Errorf("the page of a %d-byte body is %d bytes", len(c.body), len(page))
			}
			if !strings.Contains(page, `id="body-cut"`) || !strings.Contains(page, fmt.Sprintf("%d bytes, %s; the first ", len(c.body), c.kind)) {
				t.Errorf("the page does not say the body is cut, or shows it as other than %s:\n%.2000s", c.kind, page)
			}
			// The note links to the API's copy of this dead letter.
			_, href, _ := strings.Cut(page, `id="body-api" href="`)
			href, _, _ = strings.Cut(href, `"`)
			if !strings.HasPrefix(href, "/api/") {
				t.Fatalf("the note has no link to the API: %q", href)
			}
			rec = httptest.NewRecorder()
			d.ServeHTTP(rec, httptest.NewRequest("GET", html.UnescapeString(href), nil))
			var raw map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
				t.Fatalf("API: %d %v", rec.Code, err)
			}
			body, _ := raw["body"].(string)
			if id, _ := raw["id"].(string); id != m.ID {
				t.Errorf("the API's link gives dead letter %q, want %q", id, m.ID)
			}
			if rec.Code != 200 || len(body) < len(c.body) {
				t.Errorf("the API gives %d of the body's %d bytes (%d)", len(body), len(c.body), rec.Code)
			}
		})
	}
}

// deadLetterOne publishes m to "billing" on the memory broker b, receives it
// and dead-letters it.
func deadLetterOne(t *testing.T, b *memory.Broker, m *sdk.Message) {
	t.Helper()
	ctx := context.Background()
	if err := b.Publish(ctx, "billing", m); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "billing", 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive %d %v", len(ds), err)
	}
	if err := ds[0].DeadLetter(ctx, sdk.Permanent(context.Canceled)); err != nil {
		t.Fatal(err)
	}
}
