package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// captureTracer records the SQL and arguments of the relay's read of the
// outbox table (the statement that locks its batch).
type captureTracer struct {
	mu   sync.Mutex
	sql  string
	args []any
}

func (c *captureTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "FOR UPDATE SKIP LOCKED") {
		c.mu.Lock()
		c.sql, c.args = d.SQL, d.Args
		c.mu.Unlock()
	}
	return ctx
}

func (c *captureTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// rowsRead sums, over the plan nodes that read table alias "o" (the
// relay's outer scan), the rows they returned and the rows their filter
// removed: the rows the pass looked at.
func rowsRead(node map[string]any) float64 {
	var n float64
	if node["Alias"] == "o" {
		loops, _ := node["Actual Loops"].(float64)
		rows, _ := node["Actual Rows"].(float64)
		removed, _ := node["Rows Removed by Filter"].(float64)
		n += rows*loops + removed
	}
	if kids, ok := node["Plans"].([]any); ok {
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				n += rowsRead(m)
			}
		}
	}
	return n
}

// Parked rows stay in the table until an operator requeues or discards
// them: a broker that refuses a whole queue (a queue that does not exist)
// parks every row of it after MaxAttempts, hour after hour. The relay's
// read of due rows, every PollInterval, must not walk them all: it read
// the primary key in id order and filtered the parked rows out one by one,
// so 20,000 parked rows ahead of the due ones were read on every pass (the
// same when nothing is due: an idle relay scanned them every 200 ms).
func TestRelayReadDoesNotWalkParkedRows(t *testing.T) {
	ctx := context.Background()
	tr := &captureTracer{}
	pool, box, schema, b := tracedOutbox(t, tr)
	// An empty pass: the statement the relay reads its batch with.
	if _, err := box.RelayOnce(ctx, b, outbox.RelayOptions{}); err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	q, args := tr.sql, tr.args
	tr.mu.Unlock()
	if q == "" {
		t.Fatal("the relay's read was not seen")
	}

	const parked = 20000
	table := pgx.Identifier{schema, "berth_outbox"}.Sanitize()
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (queue, message_id, attempts, refusals, last_error, parked_at)
		SELECT 'q', 'parked-' || g, 20, 20, 'refused', now() FROM generate_series(1, $1) g`, parked); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		add(t, pool, box, "q", &sdk.Message{Type: "due", Body: []byte(fmt.Sprint(i))})
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		setup string
	}{
		{"ten rows due", ``},
		{"nothing due", `DELETE FROM ` + table + ` WHERE parked_at IS NULL`},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c.setup != "" {
			if _, err := tx.Exec(ctx, c.setup); err != nil {
				t.Fatal(err)
			}
		}
		var plan []byte
		if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+q, args...).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		var top []struct {
			Plan map[string]any `json:"Plan"`
		}
		if err := json.Unmarshal(plan, &top); err != nil || len(top) != 1 {
			t.Fatalf("plan %s: %v", plan, err)
		}
		if n := rowsRead(top[0].Plan); n >= parked/10 {
			t.Errorf("%s: the relay's read looked at %.0f rows of a table holding %d parked ones; want only the due rows\n%s", c.name, n, parked, plan)
		}
	}
}

// tracedOutbox returns a pool whose statements go through tracer, an
// outbox migrated on a schema of its own (dropped at the end), that schema,
// and a memory broker: for the tests that read the relay's own statements.
func tracedOutbox(t *testing.T, tracer pgx.QueryTracer) (*pgxpool.Pool, *outbox.Outbox, string, *memory.Broker) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("outbox_test_%d", rand.Uint64()%1e12)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	box, err := outbox.New(pool, outbox.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return pool, box, schema, b
}
