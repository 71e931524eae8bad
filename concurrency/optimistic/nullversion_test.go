package optimistic_test

import (
	"errors"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/optimistic"
	"github.com/berthq/berth/sdk"
)

// A row whose version column is NULL (a column added without a default, a
// row written around the package) can never be read or updated under
// optimistic concurrency: every retry fails the same way. Get and Update
// report it as a permanent ErrNullVersion naming the row, not as a
// transient scan error that spends every attempt.
func TestNullVersionIsPermanent(t *testing.T) {
	pool, _ := pgtest.Schema(t, 4)
	pgtest.Exec(t, pool,
		`CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, version bigint)`,
		`INSERT INTO orders (id, status) VALUES (1, 'pending')`)
	tbl, err := optimistic.New(optimistic.Options{Table: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	check := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, optimistic.ErrNullVersion) || !sdk.IsPermanent(err) {
			t.Errorf("%s: %v (permanent %v), want a permanent ErrNullVersion", op, err, sdk.IsPermanent(err))
		}
	}
	var status string
	_, err = tbl.Get(t.Context(), pool, int64(1), []string{"status"}, &status)
	check("Get", err)
	_, err = tbl.Update(t.Context(), pool, int64(1), 1, map[string]any{"status": "paid"})
	check("Update", err)
	var got string
	if err := pool.QueryRow(t.Context(), `SELECT status FROM orders WHERE id = 1`).Scan(&got); err != nil || got != "pending" {
		t.Errorf("row status %q (%v), want it unchanged", got, err)
	}
}
