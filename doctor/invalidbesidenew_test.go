package doctor_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/doctor"
)

// TestIndexInvalidBesideReplacement: an invalid index with its <name>_new
// beside it. A DROP INDEX CONCURRENTLY of Replace's that stopped (it marks
// the index invalid first) leaves the old one invalid and the replacement
// built: doctor gives the drop and the rename that are left, and, run as
// printed, they end OK with no _new left; while the replacement is being
// built, nothing to run (Info) until it ends. With both invalid, both are
// dropped before the index is built again. Before, the fix built the index
// again beside the _new (waiting for its build, if under way), and doctor
// then warned of that _new left over.
func TestIndexInvalidBesideReplacement(t *testing.T) {
	pool, schema, sides := leftoverSides(t)
	for _, side := range sides {
		idx := pgx.Identifier{schema, side.name}.Sanitize()
		newIdx := pgx.Identifier{schema, side.name + "_new"}.Sanitize()
		invalidate := func(ix string) string {
			return `UPDATE pg_index SET indisvalid = false WHERE indexrelid = '` + ix + `'::regclass`
		}
		runFix := func(what string) {
			t.Helper()
			f := side.finding(pool)
			if f.Severity == doctor.OK || !strings.Contains(f.Evidence, side.name+"_new") {
				t.Fatalf("%s, %s: %+v; want the invalid index and its _new named", side.id, what, f)
			}
			execAll(t, pool, printedStatements(t, f.Fix)...)
			if f := side.finding(pool); f.Severity != doctor.OK {
				t.Fatalf("%s, %s: %+v after the fix; want OK", side.id, what, f)
			}
			if n := relations(t, pool, schema, side.name+"_new"); n != 0 {
				t.Fatalf("%s, %s: %s_new left after the fix", side.id, what, side.name)
			}
		}

		// Replace's DROP of the old index stopped, its replacement built.
		execAll(t, pool, side.replace[1], invalidate(idx))
		f := side.finding(pool)
		for _, stmt := range printedStatements(t, f.Fix) {
			if strings.HasPrefix(stmt, "CREATE") {
				t.Errorf("%s: fix %q builds the index again beside its built replacement", side.id, f.Fix)
			}
		}
		runFix("replacement built")

		// Replace's build under way beside the invalid index: nothing to
		// run until it ends, then the drop and the rename.
		execAll(t, pool, invalidate(idx))
		finish := buildHeld(t, pool, side.insert, side.replace[1], newIdx)
		if f := side.finding(pool); f.Severity != doctor.Info || !strings.Contains(f.Evidence, side.name+"_new being built") || strings.HasPrefix(f.Fix, "run ") {
			t.Errorf("%s: %+v; want the replacement being built, Info, nothing to run", side.id, f)
		}
		finish()
		runFix("replacement built after its build")

		// Both invalid.
		execAll(t, pool, side.replace[1], invalidate(newIdx), invalidate(idx))
		runFix("both invalid")
	}
}
