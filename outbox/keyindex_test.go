package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// keyedTracer records the SQL and arguments of the relay's two statements
// that look for earlier rows of an ordering key: its read of the batch
// (FOR UPDATE SKIP LOCKED) and the check for rows another relay holds.
type keyedTracer struct {
	mu    sync.Mutex
	stmts map[string]capturedSQL
}

type capturedSQL struct {
	sql  string
	args []any
}

func (c *keyedTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	name := ""
	switch {
	case strings.Contains(d.SQL, "FOR UPDATE SKIP LOCKED"):
		name = "read"
	case strings.Contains(d.SQL, "unnest($1::text[], $2::text[], $3::bigint[])"):
		name = "overtaking"
	}
	if name != "" {
		c.mu.Lock()
		c.stmts[name] = capturedSQL{d.SQL, d.Args}
		c.mu.Unlock()
	}
	return ctx
}

func (c *keyedTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// tableRowsRead sums, over the plan nodes that read relation table, the
// rows they returned and the rows their filter removed, over all their
// loops (EXPLAIN gives both per loop).
func tableRowsRead(node map[string]any, table string) float64 {
	var n float64
	if node["Relation Name"] == table {
		loops, _ := node["Actual Loops"].(float64)
		rows, _ := node["Actual Rows"].(float64)
		removed, _ := node["Rows Removed by Filter"].(float64)
		n += (rows + removed) * loops
	}
	if kids, ok := node["Plans"].([]any); ok {
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				n += tableRowsRead(m, table)
			}
		}
	}
	return n
}

// TestKeyedRowsDoNotWalkTheTable: for each row with an ordering key, the
// relay looks for an earlier row of its key that holds it back (parked,
// waiting for its retry, or held by another relay). The ordering index is
// partial (WHERE ordering_key <> ”), and neither lookup said that the key
// it looks for is not ”: PostgreSQL cannot use a partial index whose
// predicate the query does not imply, so the read checked each keyed row
// by walking every row with a lower id, and the other check scanned the
// whole table. With 20,000 parked rows (a queue the broker refused for an
// hour) and 100 keyed rows due, a pass took 17 s of the database's time
// (28 million buffer reads), every pass. Each lookup must read only the
// rows of its key.
func TestKeyedRowsDoNotWalkTheTable(t *testing.T) {
	ctx := context.Background()
	tr := &keyedTracer{stmts: map[string]capturedSQL{}}
	pool, box, schema, b := tracedOutbox(t, tr)

	const parked = 20000
	table := pgx.Identifier{schema, "berth_outbox"}.Sanitize()
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (queue, message_id, attempts, refusals, last_error, parked_at)
		SELECT 'q', 'parked-' || g, 20, 20, 'refused', now() FROM generate_series(1, $1) g`, parked); err != nil {
		t.Fatal(err)
	}
	addKeyed := func(round int) {
		for i := range 10 {
			add(t, pool, box, "q", &sdk.Message{Type: "due", Key: fmt.Sprintf("order-%d", i%5), Body: []byte(fmt.Sprint(round, i))})
		}
	}
	// A pass over keyed rows: the statements the relay runs for them.
	addKeyed(0)
	if n, err := box.RelayOnce(ctx, b, outbox.RelayOptions{}); err != nil || n != 10 {
		t.Fatalf("RelayOnce = %d, %v; want the 10 keyed rows published", n, err)
	}
	tr.mu.Lock()
	stmts := tr.stmts
	tr.mu.Unlock()
	if len(stmts) != 2 {
		t.Fatalf("captured %d of the relay's 2 keyed lookups", len(stmts))
	}

	addKeyed(1)
	if _, err := pool.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"read", "overtaking"} {
		s := stmts[name]
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var plan []byte
		err = tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+s.sql, s.args...).Scan(&plan)
		_ = tx.Rollback(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var top []struct {
			Plan map[string]any `json:"Plan"`
		}
		if err := json.Unmarshal(plan, &top); err != nil || len(top) != 1 {
			t.Fatalf("plan %s: %v", plan, err)
		}
		if n := tableRowsRead(top[0].Plan, "berth_outbox"); n >= parked/10 {
			t.Errorf("%s: the relay's lookup of 10 keyed rows read %.0f rows of a table holding %d parked ones; want only the rows of their keys\n%s",
				name, n, parked, plan)
		}
	}
}
