package postgres

import (
	"strings"
	"testing"
)

// TestIndexesParsed: every index statement of schema.sql is read by
// Indexes (a statement written otherwise would go unchecked by doctor),
// the dedupe index unique.
func TestIndexesParsed(t *testing.T) {
	ixs := Indexes()
	n := 0
	for _, line := range strings.Split(schemaSQL, "\n") {
		if strings.HasPrefix(line, "CREATE") && strings.Contains(line, " INDEX ") {
			n++
		}
	}
	if n != len(ixs) || n != 5 {
		t.Fatalf("schema.sql has %d index statements; Indexes reads %d: %+v", n, len(ixs), ixs)
	}
	for _, ix := range ixs {
		if ix.Unique != (ix.Name == "jobs_dedupe_idx") || !strings.HasPrefix(ix.Def, "btree (") || !strings.Contains(ix.Def, " WHERE ") {
			t.Errorf("index %+v", ix)
		}
	}
}
