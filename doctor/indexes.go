package doctor

import (
	"fmt"
	"strings"

	"github.com/berthq/berth/internal/pgindex"
)

// indexSpec is one index a table should have, as an index check
// (postgres.indexes, ledger.indexes) describes it and the statements that
// fix it.
type indexSpec struct {
	name, cost string
	source     string // what defines it: "schema.sql", "pgledger.SQL"
	want       string // its definition there
	unique     bool
	create     string   // CREATE INDEX CONCURRENTLY IF NOT EXISTS
	drop       string   // DROP INDEX CONCURRENTLY IF EXISTS
	replace    []string // Replace: build under the name with "_new", drop, rename
	rename     string   // ALTER INDEX of the name's holder (HeldBy) to a free name
	renameNew  string   // ALTER INDEX of the name with "_new" to a free name
}

// indexVerdict is what an index check says of one index.
type indexVerdict struct {
	ok       bool
	evidence string
	fixes    []string
	// building: a CREATE INDEX CONCURRENTLY under way builds the index or
	// its replacement, nothing to run; maybeBuilding: the invalid one may
	// be another role's build (pg_stat_progress_create_index shows one
	// without its index), no DROP printed.
	building, maybeBuilding bool
	// otherwise: a valid index of the name defined otherwise.
	otherwise bool
	// unreadDrop: a DROP of an invalid index is printed while
	// pg_stat_progress_create_index could not be read.
	unreadDrop bool
	// leftover: the index is right, a replacement left beside it is not
	// (see leftover): a Warn at most, whatever the index serves.
	leftover bool
}

// classifyIndex is the one classification of both index checks: what the
// database holds for x (s: the index, its replacement under the name with
// "_new", what holds either name, builds under way) and the statements
// that fix it. A replacement Replace left is taken up where it stopped;
// an invalid index a build under way builds (or may: another role's) is
// never dropped; a name another relation holds is renamed first, and so
// is a "_new" Replace would drop that is not its replacement.
func classifyIndex(x indexSpec, s pgindex.State) indexVerdict {
	var v indexVerdict
	// The replacement Replace builds under the name with "_new": built
	// and right (its last statements were not run), under way, or left
	// invalid by a build that failed.
	newBuilt := s.NewFound != "" && s.NewValid && s.NewMatches
	newInvalid := s.NewFound != "" && !s.NewValid
	name, cost := x.name, x.cost
	switch {
	case s.Found != "" && s.Valid && s.Matches:
		leftover(&v, x, s, newBuilt, newInvalid)
	case s.Found == "" && s.HeldBy != "":
		v.evidence = fmt.Sprintf("%s missing, its name held in the schema by %s, so that CREATE INDEX IF NOT EXISTS (Migrate) skips it (%s)",
			name, s.HeldBy, cost)
		v.fixes = []string{"rename that relation (" + x.rename + " for an index)", x.create}
	case s.Found == "" && newBuilt:
		// Replace stopped after its drop: the rename is left, not a
		// second index.
		v.evidence = fmt.Sprintf("%s missing, its replacement %s_new built but not renamed (%s)", name, name, cost)
		v.fixes = x.replace[len(x.replace)-1:]
	case s.Found == "" && newInvalid && s.NewBuilding:
		// Replace's build under way, its old index dropped: when it ends
		// only the rename is left; dropping it would throw the build away.
		v.evidence = fmt.Sprintf("%s missing, its replacement %s_new being built by a CREATE INDEX CONCURRENTLY under way, not read until it ends (%s)",
			name, name, cost)
		v.building = true
	case s.Found == "" && newInvalid && s.BuildHidden:
		// It may be that build: dropping it would throw it away.
		v.evidence = fmt.Sprintf("%s missing (%s); its replacement %s_new is invalid: its build failed, or is the one %s", name, cost, name, hiddenBuild)
		v.maybeBuilding = true
	case s.Found == "" && newInvalid:
		// Never read, but kept up to date on every write: drop it rather
		// than build a second index beside it.
		v.evidence = fmt.Sprintf("%s missing (%s); its replacement %s_new is invalid, never read but kept up to date on every write: its build failed%s",
			name, cost, name, unreadHedge(s.BuildUnknown))
		v.fixes = []string{x.replace[0], x.create}
		v.unreadDrop = s.BuildUnknown
	case s.Found == "":
		v.evidence = fmt.Sprintf("%s missing (%s)", name, cost)
		v.fixes = []string{x.create}
	case s.Building && !s.Valid: // not a REINDEX CONCURRENTLY of a valid one
		// Not read until built: nothing to do but let it finish;
		// dropping it would throw the build away.
		v.evidence = fmt.Sprintf("%s being built by a CREATE INDEX CONCURRENTLY under way, not read until it ends (%s)", name, cost)
		v.building = true
	case !s.Valid && s.BuildHidden:
		// It may be that build: dropping it would throw it away.
		v.evidence = fmt.Sprintf("%s invalid, never read: a CREATE INDEX CONCURRENTLY failed, or one under way builds it, as may the one %s (%s)",
			name, hiddenBuild, cost)
		v.maybeBuilding = true
	case !s.Valid && newBuilt:
		// Replace stopped in its DROP INDEX CONCURRENTLY of the old index
		// (interrupted, that leaves it invalid): its replacement is built
		// and serves; the drop and the rename are left, not a second build.
		v.evidence = fmt.Sprintf("%s invalid, never read: a DROP INDEX CONCURRENTLY (Replace's) stopped, or a CREATE INDEX CONCURRENTLY failed (%s); its replacement %s_new is built",
			name, cost, name)
		v.fixes = x.replace[len(x.replace)-2:] // drop the old one, rename the new one
		v.unreadDrop = s.BuildUnknown
	case !s.Valid && newInvalid && s.NewBuilding:
		// Replace's build under way beside an invalid index: once built,
		// the drop and the rename are left; a CREATE now would wait for
		// it, then build a second index beside it.
		v.evidence = fmt.Sprintf("%s invalid, never read (%s); its replacement %s_new being built by a CREATE INDEX CONCURRENTLY under way, not read until it ends",
			name, cost, name)
		v.building = true
	case !s.Valid && newInvalid:
		// Both never read: a _new left would be a leftover once the index
		// is built again.
		v.evidence = fmt.Sprintf("%s invalid, never read: a CREATE INDEX CONCURRENTLY failed, or one under way builds it (%s); its replacement %s_new is invalid too: its build failed%s",
			name, cost, name, unreadHedge(s.BuildUnknown))
		v.fixes = []string{x.replace[0], x.drop, x.create}
		v.unreadDrop = s.BuildUnknown
	case !s.Valid:
		v.evidence = fmt.Sprintf("%s invalid, never read: a CREATE INDEX CONCURRENTLY failed, or one under way builds it (%s)", name, cost)
		v.fixes = []string{x.drop, x.create}
		v.unreadDrop = s.BuildUnknown
	default:
		v.otherwise = true
		what := fmt.Sprintf("%s defined as %s, not as %s has it (%s): %s", name, quoted(s.Found), x.source, quoted(x.want), cost)
		switch {
		case newBuilt:
			v.evidence = what + "; its replacement " + name + "_new is built"
			v.fixes = x.replace[len(x.replace)-2:] // drop the old one, rename the new one
		case newInvalid && s.NewBuilding:
			// Dropping it (Replace's first statement) would throw the
			// build away.
			v.evidence = what + "; its replacement " + name + "_new is being built by a CREATE INDEX CONCURRENTLY under way"
			v.building = true
		case newInvalid && s.BuildHidden:
			// It may be that build: Replace's first statement would
			// throw it away.
			v.evidence = what + "; its replacement " + name + "_new is invalid: its build failed, or is the one " + hiddenBuild
			v.maybeBuilding = true
		case newInvalid:
			why := ""
			if x.unique {
				why = " (a unique one fails on rows that share its key, which the build's error names: settle them first)"
			}
			v.evidence = what + "; its replacement " + name + "_new is invalid: its build failed" + unreadHedge(s.BuildUnknown) + why
			v.fixes = x.replace // the first statement drops the failed one
			v.unreadDrop = s.BuildUnknown
		case s.NewFound != "":
			// Valid and not Replace's (built otherwise, as by hand): it
			// may serve queries, and Replace's first statement would
			// drop it.
			v.evidence = what + "; " + name + "_new, an index of the table defined as " + quoted(s.NewFound) + ", is not its replacement and is kept"
			v.fixes = append([]string{x.renameNew}, x.replace...)
		case s.NewHeldBy != "":
			// Replace's first statement (DROP INDEX ... _new) would drop
			// the holder, as an archived table's index.
			v.evidence = what + "; the name of its replacement, " + name + "_new, is held in the schema by " + s.NewHeldBy
			v.fixes = append([]string{"rename that relation (" + x.renameNew + " for an index)"}, x.replace...)
		default:
			v.evidence = what
			v.fixes = x.replace // the old one serves while the new one builds
		}
	}
	return v
}

// leftover is the verdict on an index as its definition has it (v.ok
// unless a replacement Replace left under the name with "_new" is still
// there): a _new that is the same index, built, or invalid after a build
// that failed, is written on every write to the table and never read, and
// is dropped (a Warn); one being built is left to finish (Info; doctor
// then sees it built). A valid _new defined otherwise is not a
// replacement (made by hand, it may serve queries) and is kept.
func leftover(v *indexVerdict, x indexSpec, s pgindex.State, newBuilt, newInvalid bool) {
	name := x.name
	switch {
	case newInvalid && s.NewBuilding:
		v.evidence = fmt.Sprintf("%s is as %s has it, and a CREATE INDEX CONCURRENTLY under way builds %s_new beside it: once built it is a second index that every write updates",
			name, x.source, name)
		v.building, v.leftover = true, true
	case newInvalid && s.BuildHidden:
		v.evidence = fmt.Sprintf("%s is as %s has it; %s_new beside it is invalid: a build that failed, or the one %s", name, x.source, name, hiddenBuild)
		v.maybeBuilding, v.leftover = true, true
	case newInvalid:
		v.evidence = fmt.Sprintf("%s is as %s has it; %s_new beside it is invalid, never read but kept up to date on every write: a replacement whose build failed%s",
			name, x.source, name, unreadHedge(s.BuildUnknown))
		v.fixes = x.replace[:1]
		v.unreadDrop, v.leftover = s.BuildUnknown, true
	case newBuilt:
		v.evidence = fmt.Sprintf("%s is as %s has it; %s_new beside it is the same index again (a replacement left over): every write updates both", name, x.source, name)
		v.fixes = x.replace[:1]
		v.leftover = true
	default:
		v.ok = true
	}
}

// indexFix is the fix of an index check's finding: the statements of its
// verdicts, or, when none is left to run (builds under way, or maybe
// another role's), to let them finish. writes says what a plain CREATE
// INDEX blocks, migrate what creates the indexes (and keeps those that
// exist).
func indexFix(vs []indexVerdict, writes, migrate string) string {
	var fixes []string
	hidden, unread := false, false
	for _, v := range vs {
		fixes = append(fixes, v.fixes...)
		hidden = hidden || v.maybeBuilding
		unread = unread || v.unreadDrop
	}
	if len(fixes) == 0 {
		fix := "let the CREATE INDEX CONCURRENTLY finish, then run doctor again"
		if hidden {
			fix += " (as a role with pg_read_all_stats, or the build's own, doctor sees which index a build is of)"
		}
		return fix
	}
	fix := "run " + strings.Join(fixes, "; ") + " (each on its own, outside a transaction; CONCURRENTLY, as a plain CREATE INDEX blocks " +
		writes + " while it builds; " + migrate + " creates a missing index but keeps one that exists, invalid or not)"
	if unread {
		fix += unreadFix
	}
	return fix
}

// hiddenBuild ends the evidence of an invalid index that a build doctor's
// user may not see could be building.
const hiddenBuild = "pg_stat_progress_create_index shows under way in this database without saying of which index " +
	"(another role's, which doctor's user sees only with pg_read_all_stats): run doctor again once it has ended"

// unreadFix ends a fix printed while pg_stat_progress_create_index could
// not be read: a DROP of an invalid index in it may be of one a build under
// way is building.
const unreadFix = "; doctor's user cannot read pg_stat_progress_create_index: before a DROP INDEX of an invalid index, " +
	"check there, as a role that can, that no CREATE INDEX CONCURRENTLY under way builds it (dropping it would throw that build away)"

// unreadHedge is what the evidence of an invalid index adds while
// pg_stat_progress_create_index could not be read (unread): its build may
// be under way.
func unreadHedge(unread bool) string {
	if !unread {
		return ""
	}
	return ", or one under way builds it (doctor's user cannot read pg_stat_progress_create_index to tell which)"
}
