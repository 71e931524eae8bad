package dashboard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// The confirmation of a change chosen by a filter names the IDs it would
// leave (their letters shared with dead letters the filter does not
// choose), as the API's dry run and the CLI do: escaped, as every ID is
// (untrusted text), the first 20 and how many more. Before, it counted
// their letters ("1 more dead letter(s) match but are left") and named
// none.
func TestConfirmNamesWithheldIDs(t *testing.T) {
	const odd = "<b>dup</b>\x1b[2J\u202e"
	ids := []string{odd}
	for i := range 24 {
		ids = append(ids, fmt.Sprintf("w-%02d", i))
	}
	srv := serve(t, sharedWithRefunds(t, ids...), dashboard.Options{})
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?action=redrive&all=1&type=billing.charge")
	if code != 200 || !strings.Contains(page, `<span id="confirm-count">1</span>`) || !strings.Contains(page, `id="withheld">25 more dead letter(s) match but are left`) {
		t.Fatalf("confirm: %d; want a count of 1, 25 left:\n%s", code, page)
	}
	w := section(page, "withheld-ids", "</p>")
	if w == "" {
		t.Fatalf("the confirmation names no ID it leaves:\n%s", page)
	}
	for _, want := range []string{`&lt;b&gt;dup&lt;/b&gt;\x1b[2J\u202e`, ids[1], ids[19], "… and 5 more"} {
		if !strings.Contains(w, want) {
			t.Errorf("the IDs left lack %q:\n%s", want, w)
		}
	}
	if strings.Contains(w, ids[20]) {
		t.Errorf("more than 20 IDs left are listed:\n%s", w)
	}
	if strings.ContainsAny(w, "\x1b\u202e") || strings.Contains(w, "<b>") {
		t.Errorf("an ID left is shown raw:\n%q", w)
	}
}

// sharedWithRefunds is a memory broker whose queue billing holds, for each
// of ids, a dead letter of type billing.charge and one of billing.refund
// holding it, then one of billing.charge with the ID own.
func sharedWithRefunds(t *testing.T, ids ...string) broker {
	t.Helper()
	b := memoryBroker(t)
	ctx := context.Background()
	var letters []*sdk.Message
	for _, id := range ids {
		letters = append(letters, &sdk.Message{ID: id, Type: "billing.charge"}, &sdk.Message{ID: id, Type: "billing.refund"})
	}
	letters = append(letters, &sdk.Message{ID: "own", Type: "billing.charge"})
	for _, m := range letters {
		if err := b.Publish(ctx, "billing", m); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Receive(ctx, "billing", 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("receive %d %v", len(ds), err)
		}
		if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// The preview names at most dlq.MaxFailures IDs left: past them the
// confirmation cannot tell how many more there are, and says "at least".
func TestConfirmNamesWithheldIDsAtLeast(t *testing.T) {
	var ids []string
	for i := range dlq.MaxFailures + 5 {
		ids = append(ids, fmt.Sprintf("w-%03d", i))
	}
	srv := serve(t, sharedWithRefunds(t, ids...), dashboard.Options{})
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?action=purge&all=1&type=billing.charge")
	w := section(page, "withheld-ids", "</p>")
	if code != 200 || !strings.Contains(w, ids[19]) || strings.Contains(w, ids[20]) || !strings.Contains(w, fmt.Sprintf("… and at least %d more", dlq.MaxFailures-20)) {
		t.Errorf("confirm: %d; want 20 IDs left named, at least %d more:\n%s", code, dlq.MaxFailures-20, w)
	}
}
