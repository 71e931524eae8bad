package pgledger_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/ledger/pgledger"
)

// explainingDB runs every purge statement (the DELETE of a batch) once
// under EXPLAIN ANALYZE in a transaction it rolls back, adding up the rows
// its plan's filters removed, then for real.
type explainingDB struct {
	*pgxpool.Pool
	t          *testing.T
	statements int
	removed    float64
}

func (d *explainingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if strings.Contains(sql, "DELETE FROM") {
		d.statements++
		d.removed += explainRemoved(ctx, d.t, d.Pool, sql, args)
	}
	return d.Pool.QueryRow(ctx, sql, args...)
}

func explainRemoved(ctx context.Context, t *testing.T, pool *pgxpool.Pool, sql string, args []any) float64 {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var plan []byte
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+sql, args...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var top []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &top); err != nil || len(top) != 1 {
		t.Fatalf("plan %s: %v", plan, err)
	}
	return removedByFilter(top[0].Plan)
}

// removedByFilter sums the rows the filters of node and its children
// removed: the rows a statement looked at and passed over.
func removedByFilter(node map[string]any) float64 {
	loops, _ := node["Actual Loops"].(float64)
	removed, _ := node["Rows Removed by Filter"].(float64)
	n := removed * max(loops, 1)
	if kids, ok := node["Plans"].([]any); ok {
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				n += removedByFilter(m)
			}
		}
	}
	return n
}

// TestPurgeBatchesDoNotRereadKeptRows: the purges walk the rows last
// updated before their cutoff, oldest first, and pass over those they keep
// (for Purge the jobs that never finished; for PurgeStale those whose next
// attempt is due later: a job delayed for weeks). Every batch walked again
// from the oldest row, so each of a run's batches read every kept row
// before reaching the ones it deletes: with 5,000 delayed jobs older than
// the retention, a run deleting 3,000 finished jobs 100 at a time read
// 5,000 × 31 rows (and 200,000 delayed jobs cost each batch of the default
// 1,000 some 60 ms instead of 1 ms). A batch starts where the last one
// ended.
func TestPurgeBatchesDoNotRereadKeptRows(t *testing.T) {
	ctx, pool, schema := testSchema(t)
	db := &explainingDB{Pool: pool, t: t}
	s, err := pgledger.New(db, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const kept, finished, stale, recent = 5000, 3000, 3000, 20000
	now := time.Now()
	for _, q := range []struct {
		sql string
		n   int
		at  time.Time
	}{
		// Jobs delayed for a month, published ten days ago: older than
		// both cutoffs, kept by both purges.
		{`INSERT INTO ` + s.Table() + ` (message_id, queue, status, rank, first_seen_at, updated_at, next_attempt_at)
			SELECT 'delayed-' || g, 'q', 'enqueued', 0, $2::timestamptz + g * interval '1 ms', $2::timestamptz + g * interval '1 ms', $2::timestamptz + interval '30 days'
			FROM generate_series(1, $1) g`, kept, now.Add(-10 * 24 * time.Hour)},
		// Finished nine days ago: Purge's.
		{`INSERT INTO ` + s.Table() + ` (message_id, queue, status, rank, attempts, first_seen_at, updated_at)
			SELECT 'done-' || g, 'q', 'succeeded', 3, 1, $2::timestamptz + g * interval '1 ms', $2::timestamptz + g * interval '1 ms'
			FROM generate_series(1, $1) g`, finished, now.Add(-9 * 24 * time.Hour)},
		// Lost nine days ago, nothing due: PurgeStale's.
		{`INSERT INTO ` + s.Table() + ` (message_id, queue, status, rank, attempts, first_seen_at, updated_at)
			SELECT 'lost-' || g, 'q', 'retrying', 2, 1, $2::timestamptz + g * interval '1 ms', $2::timestamptz + g * interval '1 ms'
			FROM generate_series(1, $1) g`, stale, now.Add(-9 * 24 * time.Hour)},
		{`INSERT INTO ` + s.Table() + ` (message_id, queue, status, rank, attempts, first_seen_at, updated_at)
			SELECT 'recent-' || g, 'q', 'succeeded', 3, 1, $2::timestamptz, $2::timestamptz FROM generate_series(1, $1) g`, recent, now},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.n, q.at); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+s.Table()); err != nil {
		t.Fatal(err)
	}
	cutoff := now.Add(-24 * time.Hour)
	for _, c := range []struct {
		name  string
		purge func(context.Context, time.Time, int) (int, error)
		want  int
	}{{"Purge", s.Purge, finished}, {"PurgeStale", s.PurgeStale, stale}} {
		db.statements, db.removed = 0, 0
		n, err := c.purge(ctx, cutoff, 100)
		if err != nil || n != c.want {
			t.Fatalf("%s = %d, %v; want %d", c.name, n, err, c.want)
		}
		// One walk past the kept rows per run, not one per batch.
		if db.removed > 2*kept {
			t.Errorf("%s: %d statements passed over %.0f rows in all, with %d rows kept: each batch read them again",
				c.name, db.statements, db.removed, kept)
		}
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+s.Table()).Scan(&left); err != nil || left != kept+recent {
		t.Errorf("%d rows left, %v; want the %d delayed and %d recent jobs", left, err, kept, recent)
	}
}

// TestPurgeBatchesPastInfinity: a batch's position is the last row it
// deleted as stored, '-infinity' (a row written by hand) too, from which
// the next batch goes on.
func TestPurgeBatchesPastInfinity(t *testing.T) {
	ctx, pool, schema := testSchema(t)
	s, err := pgledger.New(pool, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+s.Table()+` (message_id, queue, status, rank, attempts, first_seen_at, updated_at)
		SELECT 'done-' || g, 'q', 'succeeded', 3, 1, now(), CASE WHEN g <= 2 THEN '-infinity' ELSE now() - g * interval '1 day' END
		FROM generate_series(1, 5) g`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Purge(ctx, time.Now(), 1); err != nil || n != 5 {
		t.Errorf("Purge = %d, %v; want 5", n, err)
	}
}
