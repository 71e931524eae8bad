package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/pause"
)

// berth queue pause/resume/paused write the pause table that pause.Sync
// reads.
func TestQueuePauseResume(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	ctx := context.Background()
	pool, schema := pgtest.Schema(t, 0)

	r := cliDB(t, "", false, "queue", "pause", "-db", dsn, "-schema", schema, "emails", "reports")
	if r.code != 0 || !strings.Contains(r.out, "emails paused") || !strings.Contains(r.out, "reports paused") {
		t.Fatalf("pause: %+v", r)
	}
	if r = cliDB(t, "", false, "queue", "pause", "-db", dsn, "-schema", schema, "emails"); r.code != 0 || !strings.Contains(r.out, "emails was paused already") {
		t.Fatalf("pause again: %+v", r)
	}
	s, err := pause.NewPG(pool, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := s.Paused(ctx)
	if err != nil || len(ps) != 2 {
		t.Fatalf("table: %+v %v", ps, err)
	}
	r = cliDB(t, "", false, "queue", "paused", "-json", "-db", dsn, "-schema", schema)
	var list jsonPausedList
	if r.code != 0 || json.Unmarshal([]byte(r.out), &list) != nil || len(list.Queues) != 2 || list.Queues[0].Queue != "emails" {
		t.Fatalf("paused -json: %+v (%+v)", r, list)
	}
	if r = cliDB(t, "", false, "queue", "resume", "-db", dsn, "-schema", schema, "emails"); r.code != 0 || !strings.Contains(r.out, "emails resumed") {
		t.Fatalf("resume: %+v", r)
	}
	if r = cliDB(t, "", false, "queue", "resume", "-db", dsn, "-schema", schema, "emails"); r.code != 0 || !strings.Contains(r.out, "emails was not paused") {
		t.Fatalf("resume again: %+v", r)
	}
	if r = cliDB(t, "", false, "queue", "paused", "-db", dsn, "-schema", schema); r.code != 0 || strings.Contains(r.out, "emails") || !strings.Contains(r.out, "reports") {
		t.Fatalf("paused: %+v", r)
	}
	// Untrusted queue names are refused before they reach a terminal or a row.
	if r = cliDB(t, "", false, "queue", "pause", "-db", dsn, "-schema", schema, "bad\x1b[31mname"); r.code == 0 || strings.Contains(r.err, "\x1b") {
		t.Errorf("bad name: %+v", r)
	}
	if r = cliDB(t, "", false, "queue", "pause", "emails"); r.code == 0 || !strings.Contains(r.err, "no database") {
		t.Errorf("without -db: %+v", r)
	}
	if r = cliDB(t, "", false, "queue", "pause", "-db", dsn, "-schema", "x;drop", "emails"); r.code == 0 {
		t.Errorf("bad schema: %+v", r)
	}
}
