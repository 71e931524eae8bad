package pgtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/integration"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSchemaIsolatesAndDrops: two tests' schemas hold tables of one name
// without seeing each other, unqualified names resolve to the test's own
// schema, and the schema is gone once the test ended.
func TestSchemaIsolatesAndDrops(t *testing.T) {
	ctx := context.Background()
	var first string
	t.Run("first", func(t *testing.T) {
		pool, schema := pgtest.Schema(t, 2)
		first = schema
		pgtest.Exec(t, pool, `CREATE TABLE orders (id text PRIMARY KEY)`, `INSERT INTO orders VALUES ('o1')`)
		other, _ := pgtest.Schema(t, 2)
		pgtest.Exec(t, other, `CREATE TABLE orders (id text PRIMARY KEY)`)
		var n int
		if err := other.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("the second schema sees %d orders (%v), want 0", n, err)
		}
		var got string
		if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&got); err != nil || got != schema {
			t.Fatalf("current_schema %q (%v), want %q", got, err, schema)
		}
		// A second pool on the same schema sees its rows.
		again := pgtest.Connect(t, integration.PostgresDSN(t), schema, false, 1)
		if err := again.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("a second pool on the schema sees %d orders (%v), want 1", n, err)
		}
	})
	conn, err := pgx.Connect(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, first).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("schema %s still exists after its test", first)
	}
}

// TestConnectSchemaNameIsQuoted: Connect quotes the schema it creates
// (CREATE SCHEMA "Name"), so the pool's search_path must name that same
// schema: a name with capitals (or a comma, a space) used unquoted in
// search_path is folded or split by PostgreSQL and names another schema,
// and unqualified table names then resolve nowhere (or to public).
func TestConnectSchemaNameIsQuoted(t *testing.T) {
	ctx := context.Background()
	for _, schema := range []string{"Orders_" + pgtest.Suffix(), "orders, public " + pgtest.Suffix()} {
		pool := pgtest.Connect(t, integration.PostgresDSN(t), schema, true, 1)
		var got *string
		if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == nil || *got != schema {
			t.Fatalf("schema %q: current_schema() = %v, want the schema Connect created", schema, got)
		}
		pgtest.Exec(t, pool, `CREATE TABLE orders (id text PRIMARY KEY)`)
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'orders'`, schema).Scan(&n); err != nil || n != 1 {
			t.Fatalf("schema %q: the unqualified table went elsewhere (%d in the schema, %v)", schema, n, err)
		}
	}
}
