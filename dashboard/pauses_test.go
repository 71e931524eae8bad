package dashboard_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/pause"
)

func pauseTable(t *testing.T) *pause.PG {
	t.Helper()
	pool, schema := pgtest.Schema(t, 0)
	s, err := pause.NewPG(pool, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// With a pause table the dashboard shows paused queues (overview badge,
// queue page, API) and pauses and resumes them; read-only refuses.
func TestPauses(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 1, 0)
	s := pauseTable(t)
	srv := serve(t, b, dashboard.Options{Pauses: s})

	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing")
	if code != 200 || !strings.Contains(page, `id="pause-queue"`) || strings.Contains(page, `id="paused-since"`) {
		t.Fatalf("queue page before pause (%d)", code)
	}
	req := mustReq("POST", srv.URL+"/queues/billing/pause", "application/x-www-form-urlencoded", "")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if code, page = post(t, req); code != 200 || !strings.Contains(page, `id="paused-since"`) || !strings.Contains(page, `id="resume"`) || !strings.Contains(page, "Queue paused") {
		t.Fatalf("after pause (%d): %s", code, page)
	}
	ps, err := s.Paused(context.Background())
	if err != nil || len(ps) != 1 || ps[0].Queue != "billing" {
		t.Fatalf("table after pause: %+v %v", ps, err)
	}
	// Pausing a paused queue changes nothing, and the page says so rather
	// than reporting a pause.
	req = mustReq("POST", srv.URL+"/queues/billing/pause", "application/x-www-form-urlencoded", "")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if code, page = post(t, req); code != 200 || !strings.Contains(page, "already paused: nothing changed") || strings.Contains(page, "Queue paused") {
		t.Fatalf("pause of a paused queue (%d): %s", code, page)
	}
	if _, page = get(t, http.DefaultClient, srv.URL+"/"); !strings.Contains(page, `class="badge paused"`) {
		t.Error("overview shows no paused badge")
	}
	_, body := get(t, http.DefaultClient, srv.URL+"/api/queues")
	var api struct {
		Queues []struct {
			Queue       string     `json:"queue"`
			PausedSince *time.Time `json:"paused_since"`
		} `json:"queues"`
	}
	if err := json.Unmarshal([]byte(body), &api); err != nil || len(api.Queues) == 0 || api.Queues[0].PausedSince == nil {
		t.Fatalf("api: %s (%v)", body, err)
	}

	ro := serve(t, b, dashboard.Options{Pauses: s, ReadOnly: true})
	if _, page = get(t, http.DefaultClient, ro.URL+"/queues/billing"); strings.Contains(page, `id="resume"`) || !strings.Contains(page, `id="paused-since"`) {
		t.Error("read-only page offers resume or hides the pause")
	}
	if code, _ = post(t, mustReq("POST", ro.URL+"/api/queues/billing/resume", "application/json", "")); code != http.StatusForbidden {
		t.Errorf("read-only resume: %d", code)
	}

	if code, body = post(t, mustReq("POST", srv.URL+"/api/queues/billing/resume", "application/json", "")); code != 200 || !strings.Contains(body, `"changed":true`) {
		t.Fatalf("api resume: %d %s", code, body)
	}
	if ps, _ := s.Paused(context.Background()); len(ps) != 0 {
		t.Errorf("still paused: %+v", ps)
	}
	req = mustReq("POST", srv.URL+"/queues/billing/resume", "application/x-www-form-urlencoded", "")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if code, page = post(t, req); code != 200 || !strings.Contains(page, "was not paused: nothing changed") || strings.Contains(page, "Queue resumed") {
		t.Fatalf("resume of a queue not paused (%d): %s", code, page)
	}
	// Without a pause table the routes say so.
	plain := serve(t, b, dashboard.Options{})
	if code, _ = post(t, mustReq("POST", plain.URL+"/api/queues/billing/pause", "application/json", "")); code != http.StatusBadRequest {
		t.Errorf("pause without a table: %d", code)
	}
	if _, page = get(t, http.DefaultClient, plain.URL+"/queues/billing"); strings.Contains(page, `id="pause"`) {
		t.Error("pause controls without a pause table")
	}
}
