package dashboard_test

import (
	"fmt"
	"html"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// A dead letter's page shows a bounded number of its headers, each name and
// value cut as the listing's cells are, and says what it left out, linking
// to the API, which gives them all. Before, every header was shown whole:
// 5,000 headers, one of them of 1 MiB of "<", made a page of over 4 MiB
// (each "<" as "&lt;"), built in memory for every request.
func TestManyLongHeadersAreShownCut(t *testing.T) {
	b, err := memory.New(memory.Options{MaxMessageSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	headers := map[string]string{"big": strings.Repeat("<", 1<<20), "a" + strings.Repeat("n", 10_000): "long name"}
	for i := range 5000 {
		headers[fmt.Sprintf("h%04d", i)] = fmt.Sprint("value ", i)
	}
	m := &sdk.Message{ID: "many", Type: "t", Body: []byte("{}"), Headers: headers}
	deadLetterOne(t, b, m)
	d, err := dashboard.New(b, dashboard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest("GET", "/queues/billing/messages/many", nil))
	page := rec.Body.String()
	if rec.Code != 200 {
		t.Fatalf("%d %.500s", rec.Code, page)
	}
	if len(page) > 200<<10 {
		t.Errorf("the page of a dead letter with %d headers is %d bytes", len(headers), len(page))
	}
	table := section(page, "headers", "</table>")
	if n := strings.Count(table, "<tr>"); n != 100 {
		t.Errorf("%d headers shown, want 100", n)
	}
	// The first 100 by name: the long name and value among them, cut.
	if !strings.Contains(table, "<th class=\"mono\">big</th><td class=\"mono\">&lt;&lt;&lt;") || !strings.Contains(table, "&lt;…</td>") {
		t.Errorf("the long value is not shown cut:\n%.2000s", table)
	}
	if strings.Contains(table, strings.Repeat("n", 200)) || !strings.Contains(table, "nnn…") {
		t.Errorf("the long name is not shown cut")
	}
	total := len(headers) + 6 // and the dead-letter headers the broker added (reason, class, …)
	note := section(page, "headers-cut", "</p>")
	if note == "" {
		t.Fatalf("no note that headers were left out:\n%.3000s", page)
	}
	if !strings.Contains(note, fmt.Sprintf("the first 100 of its %d headers", total)) || !strings.Contains(note, "cut") {
		t.Errorf("the note does not say how many headers were left out, and that values were cut: %s", note)
	}
	_, href, _ := strings.Cut(note, `href="`)
	href, _, _ = strings.Cut(href, `"`)
	if html.UnescapeString(href) != "/api/queues/billing/dead-letters/many" {
		t.Errorf("the note links to %q, not to the API's copy", href)
	}

	// A dead letter with few, short headers is shown whole, without a note.
	deadLetterOne(t, b, &sdk.Message{ID: "few", Type: "t", Body: []byte("{}"), Headers: map[string]string{"tenant": "acme"}})
	rec = httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest("GET", "/queues/billing/messages/few", nil))
	page = rec.Body.String()
	if strings.Contains(page, `id="headers-cut"`) || !strings.Contains(page, `<th class="mono">tenant</th><td class="mono">acme</td>`) {
		t.Errorf("the headers of a small dead letter are not shown whole, or said cut:\n%s", section(page, "headers", "</table>"))
	}
}
