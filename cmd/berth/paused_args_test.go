package main

import (
	"strings"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/integration"
)

// berth queue paused takes no arguments: a queue named after it (as if it
// filtered the list) is a usage error, not ignored with every paused queue
// listed and exit 0, which a script reads as "billing is paused".
func TestQueuePausedTakesNoArguments(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	_, schema := pgtest.Schema(t, 0)
	if r := cliDB(t, "", false, "queue", "pause", "-db", dsn, "-schema", schema, "emails"); r.code != 0 {
		t.Fatalf("pause: %+v", r)
	}
	r := cliDB(t, "", false, "queue", "paused", "-db", dsn, "-schema", schema, "billing")
	if r.code != exitUsage || !strings.Contains(r.err, "no arguments") || r.out != "" {
		t.Errorf("queue paused billing: %+v, want a usage error (exit 2) and nothing listed", r)
	}
}
