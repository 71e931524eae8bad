package dashboard_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// Two dead letters share the ID dup (a producer that reused a message ID):
// the broker moves both when given it. Ticking one confirms 2 and says
// why, the API's dry run counts 2, and a change limited to 1 (the count
// confirmed before) touches neither. Before, the confirmation said 1 and
// the purge of 1 deleted 2.
func TestSharedIDIsConfirmedWithEveryLetter(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	ctx := context.Background()
	for _, id := range []string{"dup", "dup", "own"} {
		if err := mb.Publish(ctx, "billing", &sdk.Message{ID: id, Type: "billing.charge"}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := mb.Receive(ctx, "billing", 3)
	if err != nil || len(ds) != 3 {
		t.Fatalf("receive %d %v", len(ds), err)
	}
	for _, d := range ds {
		if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
			t.Fatal(err)
		}
	}
	srv := serve(t, mb, dashboard.Options{})
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?action=purge&id=dup")
	if code != 200 || !strings.Contains(page, `<span id="confirm-count">2</span>`) || !strings.Contains(page, `id="shared-ids">2 of them share their ID`) {
		t.Errorf("confirm: %d; want a count of 2 and why:\n%s", code, page)
	}
	code, body := post(t, mustReq("POST", srv.URL+"/api/queues/billing/purge", "application/json", `{"ids":["dup"],"dry_run":true}`))
	if code != 200 || !strings.Contains(body, `"matched":2`) {
		t.Errorf("dry run: %d %s; want matched 2", code, body)
	}
	form := url.Values{"id": {"dup"}, "limit": {"1"}}
	_, page = post(t, mustReq("POST", srv.URL+"/queues/billing/purge", "application/x-www-form-urlencoded", form.Encode()))
	if st := stats(t, mb); st.DeadLettered != 3 {
		t.Fatalf("a purge confirmed for 1 letter left %d of 3 dead letters", st.DeadLettered)
	}
	if !strings.Contains(page, "purged 0 dead letter(s); 2 of the chosen were not purged") || !strings.Contains(page, "held by more dead letters than were left of the count confirmed") {
		t.Errorf("the banner of a purge confirmed for 1 does not say why the 2 were not purged:\n%s", page)
	}
	form.Set("limit", "2")
	code, page = post(t, mustReq("POST", srv.URL+"/queues/billing/purge", "application/x-www-form-urlencoded", form.Encode()))
	if code != 200 || !strings.Contains(page, "purged 2 dead letter(s)<") {
		t.Errorf("purge of 2: %d:\n%s", code, page)
	}
	if st := stats(t, mb); st.DeadLettered != 1 {
		t.Errorf("%d dead letters left, want 1", st.DeadLettered)
	}
}

// "All matching" type billing.charge, where the ID dup is held by a letter
// of that type and one of another: a change of dup would move both, so the
// confirmation counts 1 (own) and says why dup is left, the API's dry run
// counts it missed, and the change confirmed leaves both dup letters and
// says why. Before, the confirmation said 2 and the redrive moved 3.
func TestFilterLeavesSharedIDOnTheDashboard(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	ctx := context.Background()
	for _, m := range []*sdk.Message{{ID: "dup", Type: "billing.charge"}, {ID: "dup", Type: "billing.refund"}, {ID: "own", Type: "billing.charge"}} {
		if err := mb.Publish(ctx, "billing", m); err != nil {
			t.Fatal(err)
		}
		ds, err := mb.Receive(ctx, "billing", 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("receive %d %v", len(ds), err)
		}
		if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
			t.Fatal(err)
		}
	}
	srv := serve(t, mb, dashboard.Options{})
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing/confirm?action=redrive&all=1&type=billing.charge")
	if code != 200 || !strings.Contains(page, `<span id="confirm-count">1</span>`) || !strings.Contains(page, `id="withheld">1 more dead letter(s) match but are left`) {
		t.Errorf("confirm: %d; want a count of 1 and why dup is left:\n%s", code, page)
	}
	limit := regexp.MustCompile(`name="limit" value="(\d+)"`).FindStringSubmatch(page)
	if limit == nil || limit[1] != "2" {
		t.Fatalf("the form's limit: %q; want 2, every letter matched", limit)
	}
	code, body := post(t, mustReq("POST", srv.URL+"/api/queues/billing/redrive", "application/json", `{"all":true,"type":"billing.charge","dry_run":true}`))
	if code != 200 || !strings.Contains(body, `"matched":2`) || !strings.Contains(body, `"missed":1`) {
		t.Errorf("dry run: %d %s; want matched 2, missed 1", code, body)
	}
	// It names dup, as the change would (it only counted it).
	if !strings.Contains(body, `"failed":[{"id":"dup","error":"dead letters the change did not choose hold this ID too: 2 dead letters hold this ID and only 1 of them`) {
		t.Errorf("the dry run does not name dup: %s", body)
	}
	form := url.Values{"all": {"1"}, "type": {"billing.charge"}, "limit": {limit[1]}}
	_, page = post(t, mustReq("POST", srv.URL+"/queues/billing/redrive", "application/x-www-form-urlencoded", form.Encode()))
	if st := stats(t, mb); st.DeadLettered != 2 {
		t.Fatalf("the redrive left %d of 3 dead letters, want the 2 holding dup", st.DeadLettered)
	}
	if !strings.Contains(page, "redriven 1 dead letter(s); 1 of the chosen were not redriven") || !strings.Contains(page, "share their ID with dead letters the filter did not choose") {
		t.Errorf("the banner does not say why dup was not redriven:\n%s", page)
	}
}
