package pgindex

import (
	"slices"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMatches: the definition pg_get_indexdef writes back matches when it
// is the one wanted, storage parameters aside, and UNIQUE only when wanted.
func TestMatches(t *testing.T) {
	const want = "btree (queue, status) WHERE (status = 'dead'::text)"
	for _, c := range []struct {
		def    string
		unique bool
		ok     bool
	}{
		{`CREATE INDEX i ON s.t USING btree (queue, status) WHERE (status = 'dead'::text)`, false, true},
		{`CREATE INDEX i ON s.t USING btree (queue, status) WITH (fillfactor='80') WHERE (status = 'dead'::text)`, false, true},
		{`CREATE UNIQUE INDEX i ON s.t USING btree (queue, status) WHERE (status = 'dead'::text)`, false, false},
		{`CREATE UNIQUE INDEX i ON s.t USING btree (queue, status) WHERE (status = 'dead'::text)`, true, true},
		{`CREATE INDEX i ON s.t USING btree (queue, status) WHERE (status = 'dead'::text)`, true, false},
		{`CREATE INDEX i ON s.t USING btree (queue) WHERE (status = 'dead'::text)`, false, false},
		{`CREATE INDEX i ON s.t USING hash (queue, status) WHERE (status = 'dead'::text)`, false, false},
	} {
		if got := Matches(c.def, c.unique, want); got != c.ok {
			t.Errorf("Matches(%q, unique %v) = %v, want %v", c.def, c.unique, got, c.ok)
		}
	}
}

// TestState: an index and its replacement as read, what holds either name
// elsewhere, and a build hidden or unknown only where one of them is
// invalid.
func TestState(t *testing.T) {
	yes := func(string) bool { return true }
	c := Catalog{Rels: map[string]Rel{
		"a":     {OnTable: true, Valid: true, Def: "CREATE INDEX a ..."},
		"a_new": {OnTable: true, Valid: false, Def: "CREATE INDEX a_new ...", Building: true, Free: "a_new_old"},
		"b":     {Holder: "an index of jobs_2025", Free: "b_old2"},
		"b_new": {Holder: "a table", Free: "b_new_old"},
		"c":     {OnTable: true, Valid: true, Def: "CREATE INDEX c ..."},
	}, Hidden: true, Unread: true}
	a := c.State("a", yes)
	if a.Found == "" || !a.Valid || !a.Matches || a.NewFound == "" || a.NewValid || !a.NewBuilding || a.NewTo != "a_new_old" ||
		!a.BuildHidden || !a.BuildUnknown || a.HeldBy != "" {
		t.Errorf("a: %+v", a)
	}
	b := c.State("b", yes)
	if b.Found != "" || b.HeldBy != "an index of jobs_2025" || b.RenameTo != "b_old2" || b.NewHeldBy != "a table" || b.NewTo != "b_new_old" ||
		b.BuildHidden || b.BuildUnknown {
		t.Errorf("b: %+v", b)
	}
	if s := c.State("c", func(string) bool { return false }); s.Matches || s.BuildHidden || s.BuildUnknown || s.NewFound != "" {
		t.Errorf("c: %+v", s)
	}
	if s := c.State("d", yes); s != (State{}) {
		t.Errorf("d, absent: %+v", s)
	}
}

// TestReplace: the replacement is built under the name with "_new"
// (dropped first), then the old index dropped and the new one renamed.
func TestReplace(t *testing.T) {
	got := Replace("s", "i", func(name string) string { return "CREATE " + name })
	want := []string{
		`DROP INDEX CONCURRENTLY IF EXISTS "s"."i_new"`,
		"CREATE i_new",
		`DROP INDEX CONCURRENTLY IF EXISTS "s"."i"`,
		`ALTER INDEX "s"."i_new" RENAME TO "i"`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("Replace: %q, want %q", got, want)
	}
}
