package dashboard_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
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
