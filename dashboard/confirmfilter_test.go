package dashboard_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/berthq/berth/dashboard"
)

// section returns the element of page whose id is id, up to its closing
// tag end ("" when the page has none).
func section(page, id, end string) string {
	_, s, ok := strings.Cut(page, `id="`+id+`"`)
	if !ok {
		return ""
	}
	s, _, _ = strings.Cut(s, end)
	return s
}

// The confirmation of a change shows what the change applies to: the
// queue, the filter (type, class, reason, age) and the chosen IDs, as text
// escaped as every message text is, the list of IDs bounded. Before, it
// showed only a count and a sample, the filter being in hidden fields: an
// operator could not see what they confirmed.
func TestConfirmShowsTheFilter(t *testing.T) {
	b := memoryBroker(t)
	ids := seed(t, b, 30, 0)
	srv := serve(t, b, dashboard.Options{})

	evil := "<b>declined</b>\u202e\x1b[2J"
	q := url.Values{"action": {"purge"}, "all": {"1"}, "type": {"billing.charge, billing.refund"}, "class": {"permanent"},
		"reason": {evil}, "older_than": {"1s"}, "newer_than": {"72h"}}
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?"+q.Encode())
	if code != 200 {
		t.Fatalf("confirm: %d %s", code, page)
	}
	f := section(page, "confirm-filter", "</table>")
	for _, want := range []string{"billing", "every dead letter matching", "billing.charge, billing.refund", "permanent",
		`contains &lt;b&gt;declined&lt;/b&gt;\u202e\x1b[2J`, "more than 1s ago", "less than 72h ago"} {
		if !strings.Contains(f, want) {
			t.Errorf("the confirmation's filter lacks %q:\n%s", want, f)
		}
	}
	if strings.Contains(f, "\u202e") || strings.Contains(f, "\x1b") || strings.Contains(f, "<b>") {
		t.Errorf("the confirmation shows the reason's text raw:\n%s", f)
	}

	// No filter: every dead letter of the queue, said so.
	_, page = get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?action=redrive&all=1")
	if f := section(page, "confirm-filter", "</table>"); !strings.Contains(f, "every dead letter of billing") {
		t.Errorf("the confirmation of a change without a filter does not say it is every dead letter:\n%s", f)
	}

	// Chosen by ID: the IDs, the first 20 of them and how many more.
	q = url.Values{"action": {"redrive"}, "id": ids, "class": {"transient"}, "reason": {"/timeout/"}}
	_, page = get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?"+q.Encode())
	f = section(page, "confirm-filter", "</table>")
	for _, want := range []string{"30 chosen", ids[0], ids[19], "and 10 more", "transient", "matches the regexp /timeout/"} {
		if !strings.Contains(f, want) {
			t.Errorf("the confirmation's filter lacks %q:\n%s", want, f)
		}
	}
	if strings.Contains(f, ids[20]) {
		t.Errorf("the confirmation lists more than 20 IDs:\n%s", f)
	}
	if strings.Contains(f, "every dead letter") {
		t.Errorf("a change of chosen IDs is shown as one of every match:\n%s", f)
	}
	// A long ID is cut, as in the listing.
	q = url.Values{"action": {"redrive"}, "id": {strings.Repeat("x", 5000)}}
	_, page = get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?"+q.Encode())
	if f := section(page, "confirm-filter", "</table>"); len(f) > 2000 || !strings.Contains(f, fmt.Sprint(strings.Repeat("x", 30), "…")) {
		t.Errorf("a long ID is not shown cut (%d bytes):\n%.3000s", len(f), f)
	}
}
