package postgres_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// A redrive of chosen IDs reads those rows, not every dead letter of the
// queue: `berth dlq redrive` calls it once per page, so reading the whole
// queue each time made a 100,000-letter redrive quadratic (688 ms per page
// of 500 once PostgreSQL used a generic plan, against 19 ms). The table's
// own counters tell how many rows the statement fetched.
func TestRedriveByIDReadsOnlyThoseRows(t *testing.T) {
	ctx := testCtx(t)
	pool := newPool(t, "redrive-by-id", 1) // one connection: its statistics can be flushed on demand
	b := newBroker(t, pool, postgres.Options{DisableListen: true})
	const n = 3000
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "t", Body: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	if err := b.Publish(ctx, "q", msgs...); err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{b.Schema(), "jobs"}.Sanitize()
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET status = 'dead_letter'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+table); err != nil { // a table in use has statistics
		t.Fatal(err)
	}
	// pgx prepares its statements and PostgreSQL moves a statement to a
	// generic plan after five runs; force that plan now (the pool's one
	// connection keeps the setting).
	if _, err := pool.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	fetched := func() int64 {
		t.Helper()
		// Flush this connection's pending statistics, then read them fresh.
		if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		var v int64
		err := pool.QueryRow(ctx, `SELECT pg_stat_clear_snapshot()::text, COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0)
			FROM pg_stat_user_tables WHERE relid = $1::regclass`, table).Scan(new(string), &v)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := fetched()
	ids := []string{msgs[10].ID, msgs[1500].ID, msgs[2999].ID}
	if got, err := b.RedriveDeadLetters(ctx, "q", ids...); err != nil || got != 3 {
		t.Fatalf("redrive: %d %v", got, err)
	}
	if read := fetched() - before; read > 100 {
		t.Fatalf("redriving 3 of %d dead letters read %d rows", n, read)
	}
}

// An ID no message can have on this broker (a NUL, invalid UTF-8: Publish
// refuses them), as a URL or a JSON body can carry it, is not found: not a
// database error that a caller reports as a failure of the broker.
func TestUnstorableIDNotFound(t *testing.T) {
	ctx := testCtx(t)
	b := newBroker(t, newPool(t, "unstorable-id", 2), postgres.Options{DisableListen: true})
	ids := publishN(t, b, "q", 1)
	ds := receiveN(t, b, "q", 1)
	if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("declined"))); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"\xff", "a\x00b"} {
		if _, err := b.GetDeadLetter(ctx, "q", bad); !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("GetDeadLetter(%q) = %v, want ErrNotFound", bad, err)
		}
		if n, err := b.RedriveDeadLetters(ctx, "q", ids[0], bad); n != 0 || !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("RedriveDeadLetters(%q) = %d, %v, want 0, ErrNotFound", bad, n, err)
		}
		if n, err := b.DeleteDeadLetters(ctx, "q", ids[0], bad); n != 0 || !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("DeleteDeadLetters(%q) = %d, %v, want 0, ErrNotFound", bad, n, err)
		}
	}
	if _, err := b.GetDeadLetter(ctx, "q\xff", ids[0]); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("GetDeadLetter of an invalid queue name = %v, want ErrInvalidQueue", err)
	}
	if st, err := b.Stats(ctx, "q"); err != nil || st.DeadLettered != 1 {
		t.Errorf("the dead letter was changed: %+v, %v", st, err)
	}
}

// TestDeadLetterPageUsesIndexNoSort: a dead-letter page (DeadLetterPage,
// DeadLetterPageTo, the CLI's and dashboard's walk) reads its rows in
// (updated_at, id) order from jobs_dead_letter_page_idx and stops at the
// limit. Before that index, the only dead-letter index was (queue,
// message_id): every page fetched all the queue's dead letters and sorted
// them, so walking a large dead-letter queue was quadratic. The plans are
// checked for the first page, a later page and pages up to a mark, both as
// first planned (custom) and as the generic plan PostgreSQL moves a
// prepared statement to after five runs, on a table that was migrated
// before the index existed and migrated again. The cursor and the mark
// bound the index scan: with one statement for every shape ("$2 IS NULL OR
// (updated_at, id) > ..."), the generic plan filtered the rows it read, and
// each later page read every dead letter before its cursor.
func TestDeadLetterPageUsesIndexNoSort(t *testing.T) {
	ctx := testCtx(t)
	pool := newPool(t, "dlq-page-plan-"+suffix(), 1) // one connection: it keeps plan_cache_mode and the prepared statement
	b := newBroker(t, pool, postgres.Options{DisableListen: true})
	table := pgx.Identifier{b.Schema(), "jobs"}.Sanitize()
	// A table migrated before the index: Migrate adds it.
	if _, err := pool.Exec(ctx, `DROP INDEX IF EXISTS `+pgx.Identifier{b.Schema(), "jobs_dead_letter_page_idx"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Two queues of dead letters, and completed and queued rows around them.
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (queue, message_id, payload, max_attempts, status, updated_at)
		SELECT q, q || '-' || i, '', 5, s, now() - i * interval '1 second'
		FROM generate_series(1, 4000) AS i, unnest(ARRAY['a', 'b']) AS q,
			unnest(ARRAY['dead_letter', 'dead_letter', 'completed', 'queued']) AS s`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	// Each page shape is its own statement; the cursor and the mark must
	// bound the index scan (Index Cond), not filter what it read: a filter
	// reads every dead letter before the cursor, on every page.
	pages := []struct {
		name         string
		cursor, mark bool
		args         string
	}{
		{"first page", false, false, `'a', 101`},
		{"later page", true, false, `'a', 101, now() - interval '2000 seconds', 12345`},
		{"first page up to mark", false, true, `'a', 101, now() - interval '100 seconds', 999999`},
		{"page up to mark", true, true, `'a', 101, now() - interval '3000 seconds', 12345, now() - interval '100 seconds', 999999`},
	}
	for i, p := range pages {
		if _, err := pool.Exec(ctx, fmt.Sprintf(`PREPARE dlq_page_%d AS `, i)+b.DeadLetterPageSQL(p.cursor, p.mark)); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := pool.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
			t.Fatal(err)
		}
		for i, p := range pages {
			name := p.name
			var plan []byte
			if err := pool.QueryRow(ctx, fmt.Sprintf(`EXPLAIN (FORMAT JSON) EXECUTE dlq_page_%d(%s)`, i, p.args)).Scan(&plan); err != nil {
				t.Fatal(err)
			}
			var tree []struct{ Plan planNode }
			if err := json.Unmarshal(plan, &tree); err != nil || len(tree) != 1 {
				t.Fatalf("%s, %s: plan %s: %v", name, mode, plan, err)
			}
			var types, indexes []string
			tree[0].Plan.walk(func(n planNode) {
				types = append(types, n.NodeType)
				if n.IndexName != "" {
					indexes = append(indexes, n.IndexName)
				}
				if n.Filter != "" {
					t.Errorf("%s, %s: %s filters the rows it read (%s), instead of bounding its scan: %s",
						name, mode, n.NodeType, n.Filter, plan)
				}
				if n.IndexName != "" && (p.cursor || p.mark) && !strings.Contains(n.IndexCond, "ROW(updated_at, id)") {
					t.Errorf("%s, %s: the index scan is not bounded by the page's position (Index Cond %q): %s",
						name, mode, n.IndexCond, plan)
				}
			})
			for _, ty := range types {
				if strings.Contains(ty, "Sort") {
					t.Errorf("%s, %s: the plan sorts (%s): %s", name, mode, strings.Join(types, " > "), plan)
				}
			}
			if strings.Join(indexes, ",") != "jobs_dead_letter_page_idx" {
				t.Errorf("%s, %s: the plan reads indexes %v, want jobs_dead_letter_page_idx: %s", name, mode, indexes, plan)
			}
		}
	}
}

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	NodeType  string     `json:"Node Type"`
	IndexName string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	Filter    string     `json:"Filter"`
	Plans     []planNode `json:"Plans"`
}

func (n planNode) walk(f func(planNode)) {
	f(n)
	for _, c := range n.Plans {
		c.walk(f)
	}
}

// TestRedriveAllDoesNotReadTheIDs: a redrive of all a queue's dead letters
// counts them without reading their IDs. It read every redriven row's
// message_id into one slice, only to return its length: a queue of millions
// of dead letters took memory in proportion (here 10 MB of IDs).
func TestRedriveAllDoesNotReadTheIDs(t *testing.T) {
	ctx := testCtx(t)
	pool := newPool(t, "redrive-all-"+suffix(), 0)
	b := newBroker(t, pool, postgres.Options{DisableListen: true})
	const rows, idLen = 20000, 500
	if _, err := pool.Exec(ctx, `INSERT INTO `+b.Schema()+`.jobs (queue, message_id, payload, status, max_attempts)
		SELECT 'q', lpad(i::text, $1, 'x'), '', 'dead_letter', 5 FROM generate_series(1, $2) AS i`, idLen, rows); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	n, err := b.RedriveDeadLetters(ctx, "q")
	runtime.ReadMemStats(&after)
	if err != nil || n != rows {
		t.Fatalf("RedriveDeadLetters = %d, %v; want %d", n, err, rows)
	}
	if alloc, most := after.TotalAlloc-before.TotalAlloc, uint64(rows*idLen/4); alloc > most {
		t.Errorf("redriving %d dead letters allocated %d bytes; want at most %d (their IDs are not needed)", rows, alloc, most)
	}
	counts, err := b.CountByStatus(ctx, "q")
	if err != nil || counts[postgres.StatusQueued] != rows || counts[postgres.StatusDeadLetter] != 0 {
		t.Fatalf("after the redrive: %v, %v; want %d queued, no dead letter", counts, err, rows)
	}
}
