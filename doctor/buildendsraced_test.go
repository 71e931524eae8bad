package doctor_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/ledger/pgledger"
)

// betweenReads is a pool that runs hook once, when a transaction begins
// after the index check's catalog read (the one that asks
// pg_get_indexdef): between that read and the read of the builds under
// way.
type betweenReads struct {
	*pgxpool.Pool
	mu      sync.Mutex
	catalog bool
	hook    func()
}

func (b *betweenReads) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "pg_get_indexdef") {
		b.mu.Lock()
		b.catalog = true
		b.mu.Unlock()
	}
	return b.Pool.Query(ctx, sql, args...)
}

func (b *betweenReads) Begin(ctx context.Context) (pgx.Tx, error) {
	b.mu.Lock()
	hook := b.hook
	if b.catalog {
		b.hook = nil
	} else {
		hook = nil
	}
	b.mu.Unlock()
	if hook != nil {
		hook()
	}
	return b.Pool.Begin(ctx)
}

// TestIndexBuildEndingBetweenReads: an index being built when the catalog
// is read (invalid) whose CREATE INDEX CONCURRENTLY ends before
// pg_stat_progress_create_index is read. It serves by then: doctor says a
// build is under way (run it again) and prints no DROP of it. Before, it
// read as a build that failed, and the fix dropped the index that had just
// been built, leaving the table without it until it was built again.
func TestIndexBuildEndingBetweenReads(t *testing.T) {
	pool, schema, sides := leftoverSides(t)
	side := sides[1] // the ledger's: its store takes any DB
	create := strings.Replace(side.replace[1], `"`+side.name+`_new"`, `"`+side.name+`"`, 1)
	execAll(t, pool, `DROP INDEX `+pgx.Identifier{schema, side.name}.Sanitize())
	finish := buildHeld(t, pool, side.insert, create, pgx.Identifier{schema, side.name}.Sanitize())
	db := &betweenReads{Pool: pool, hook: finish}
	store, err := pgledger.New(db, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	f := ledgerIndexFinding(t, store, schema+".ledger_jobs")
	db.mu.Lock()
	ran := db.hook == nil
	db.mu.Unlock()
	if !ran {
		t.Fatal("the build did not end between the reads")
	}
	if strings.HasPrefix(f.Fix, "run ") && strings.Contains(f.Fix, "DROP INDEX CONCURRENTLY IF EXISTS "+pgx.Identifier{schema, side.name}.Sanitize()+";") {
		t.Fatalf("%+v: the fix drops the index whose build has just ended", f)
	}
	if f.Severity != doctor.Info || !strings.Contains(f.Evidence, side.name+" being built") {
		t.Errorf("%+v; want the build named, Info", f)
	}
	if f := ledgerIndexFinding(t, store, schema+".ledger_jobs"); f.Severity != doctor.OK {
		t.Errorf("%+v on the run after; want OK", f)
	}
}
