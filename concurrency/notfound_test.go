package concurrency_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/fence"
	"github.com/berthq/berth/concurrency/optimistic"
	"github.com/berthq/berth/concurrency/rowlock"
	"github.com/berthq/berth/concurrency/state"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestHardening15_NotFoundConvention checks that a missing row is one error
// in every concurrency package: it matches the package's own sentinel and
// sdk.ErrNotFound, and it is permanent (a job about a row that does not exist
// cannot succeed). Before, each package had a look-alike sentinel unrelated
// to sdk.ErrNotFound, and only state marked it permanent.
func TestHardening15_NotFoundConvention(t *testing.T) {
	pool, _ := pgtest.Schema(t, 2)
	pgtest.Exec(t, pool,
		`CREATE TABLE items (id bigint PRIMARY KEY, status text NOT NULL, n bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 1, fence_token bigint)`)

	for name, sentinel := range map[string]error{
		"rowlock": rowlock.ErrNotFound, "optimistic": optimistic.ErrNotFound,
		"fence": fence.ErrNotFound, "state": state.ErrNotFound,
	} {
		if !errors.Is(sentinel, sdk.ErrNotFound) {
			t.Errorf("%s.ErrNotFound does not match sdk.ErrNotFound", name)
		}
		if errors.Is(sdk.ErrNotFound, sentinel) {
			t.Errorf("sdk.ErrNotFound matches %s.ErrNotFound: the package sentinel must stay distinct", name)
		}
	}

	const missing = 404
	cases := lookupCalls(t, pool, missing)
	for _, c := range cases {
		err := c.call()
		switch {
		case err == nil:
			t.Errorf("%s of a missing row: nil error", c.name)
		case !errors.Is(err, c.sentinel):
			t.Errorf("%s: %v, want the package's ErrNotFound", c.name, err)
		case !errors.Is(err, sdk.ErrNotFound):
			t.Errorf("%s: %v does not match sdk.ErrNotFound", c.name, err)
		case sdk.Classify(err) != sdk.ClassPermanent:
			t.Errorf("%s: %v classified %q, want permanent", c.name, err, sdk.Classify(err))
		}
	}
}

// TestUnstorableKeyIsNotFound: a string key PostgreSQL text cannot hold (a
// NUL byte — JSON's "\u0000" decodes to one — or invalid UTF-8) names no
// row, since no row can hold it. Before, each package sent it and returned
// PostgreSQL's refusal (SQLSTATE 22021) as an untyped, transient error: the
// job was retried to its last attempt instead of failing permanently, and
// rowlock's refused statement aborted the caller's transaction.
func TestUnstorableKeyIsNotFound(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.Schema(t, 2)
	pgtest.Exec(t, pool,
		`CREATE TABLE items (id text PRIMARY KEY, status text NOT NULL, n bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 1, fence_token bigint)`,
		`INSERT INTO items (id, status) VALUES ('a', 'pending')`)

	for _, key := range []string{"a\x00", "\xff", "a\xc3", "b\n\x1b[31mforged"} {
		cases := lookupCalls(t, pool, key)
		for _, c := range cases {
			err := c.call()
			switch {
			case err == nil:
				t.Errorf("%s(%q): nil error", c.name, key)
			case !errors.Is(err, c.sentinel):
				t.Errorf("%s(%q): %v, want the package's ErrNotFound", c.name, key, err)
			case sdk.Classify(err) != sdk.ClassPermanent:
				t.Errorf("%s(%q): %v classified %q, want permanent", c.name, key, err, sdk.Classify(err))
			case strings.ContainsAny(err.Error(), "\x00\n\x1b") || !strings.Contains(err.Error(), strconv.Quote(key)):
				// A key comes from a message: quoted in the error, it can
				// neither forge a log line nor reach a terminal raw.
				t.Errorf("%s(%q): error %q does not quote the key", c.name, key, err)
			}
		}
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM items WHERE id = 'a'`).Scan(&status); err != nil || status != "pending" {
		t.Fatalf("row a: %q, %v; want untouched", status, err)
	}
}

// itemsTools returns a rowlock, an optimistic table, a fence and a state
// machine on the table items (column n; states pending → paid).
func itemsTools(t *testing.T) (*rowlock.Locker, *optimistic.Table, *fence.Table, *state.Machine) {
	t.Helper()
	locker, err := rowlock.New(rowlock.Options{Table: "items", Columns: []string{"n"}})
	if err != nil {
		t.Fatal(err)
	}
	versioned, err := optimistic.New(optimistic.Options{Table: "items"})
	if err != nil {
		t.Fatal(err)
	}
	fenced, err := fence.New(fence.Options{Table: "items"})
	if err != nil {
		t.Fatal(err)
	}
	flow, err := state.New(state.Options{Table: "items", Transitions: map[string][]string{"pending": {"paid"}, "paid": nil}})
	if err != nil {
		t.Fatal(err)
	}
	return locker, versioned, fenced, flow
}

// lookupCall is one call of a concurrency tool by a row key, and the
// sentinel it must wrap when no row has that key.
type lookupCall struct {
	name     string
	sentinel error
	call     func() error
}

// lookupCalls returns the lookups of the four tools on the table items
// (see itemsTools) by key. rowlock's runs in a transaction and checks that
// the transaction stays usable after it, as after any missing row.
func lookupCalls(t *testing.T, pool *pgxpool.Pool, key any) []lookupCall {
	t.Helper()
	ctx := context.Background()
	locker, versioned, fenced, flow := itemsTools(t)
	return []lookupCall{
		{"rowlock.Lock", rowlock.ErrNotFound, func() error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var n int64
				_, err := locker.Lock(ctx, tx, key, &n)
				var id any = "a"
				if _, isString := key.(string); !isString {
					id = key
				}
				if _, err2 := locker.Lock(ctx, tx, id, &n); err2 != nil && !errors.Is(err2, rowlock.ErrNotFound) {
					t.Errorf("rowlock.Lock(%v) left the transaction unusable: %v", key, err2)
				}
				return err
			})
		}},
		{"optimistic.Get", optimistic.ErrNotFound, func() error {
			_, err := versioned.Get(ctx, pool, key, nil)
			return err
		}},
		{"optimistic.Update", optimistic.ErrNotFound, func() error {
			_, err := versioned.Update(ctx, pool, key, 1, map[string]any{"n": 1})
			return err
		}},
		{"fence.Check", fence.ErrNotFound, func() error { return fenced.Check(ctx, pool, key, 1) }},
		{"fence.Update", fence.ErrNotFound, func() error {
			return fenced.Update(ctx, pool, key, 1, map[string]any{"n": 1})
		}},
		{"state.Transition", state.ErrNotFound, func() error {
			_, err := flow.Transition(ctx, pool, key, "paid", nil)
			return err
		}},
	}
}

// orderID is a row key of a type of its own, as applications declare them.
type orderID string

// TestUnstorableNamedStringKeyIsNotFound: a key of a named string type
// (type OrderID string), which pgx sends as text like a string, names no row
// when PostgreSQL text cannot hold it, as a plain string key does. Before,
// only a plain string was checked: such a key was sent, refused with SQLSTATE
// 22021 as a transient error, and rowlock's refusal aborted the caller's
// transaction.
func TestUnstorableNamedStringKeyIsNotFound(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.Schema(t, 2)
	pgtest.Exec(t, pool,
		`CREATE TABLE items (id text PRIMARY KEY, status text NOT NULL, n bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 1, fence_token bigint)`,
		`INSERT INTO items (id, status) VALUES ('a', 'pending')`)
	bad := orderID("a\x00")
	for _, key := range []any{bad, &bad} {
		for _, c := range lookupCalls(t, pool, key) {
			err := c.call()
			if !errors.Is(err, c.sentinel) || sdk.Classify(err) != sdk.ClassPermanent {
				t.Errorf("%s(%T %q): %v, want the package's permanent ErrNotFound", c.name, key, bad, err)
			} else if !strings.Contains(err.Error(), strconv.Quote(string(bad))) {
				t.Errorf("%s(%T %q): error %q does not quote the key", c.name, key, bad, err)
			}
		}
	}
	locker, _, _, _ := itemsTools(t)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var n int64
		if _, err := locker.Lock(ctx, tx, bad, &n); !errors.Is(err, rowlock.ErrNotFound) {
			t.Errorf("rowlock.Lock(%q): %v, want ErrNotFound", bad, err)
		}
		_, err := locker.Lock(ctx, tx, orderID("a"), &n)
		return err
	})
	if err != nil {
		t.Fatalf("the transaction after rowlock.Lock(%q): %v, want it usable", bad, err)
	}
}

// TestMalformedValueIsPermanent: a key the key column's type cannot read
// ("abc" or a number beyond bigint's range, for a bigint key — a message's
// order id, as text), or a value to set of the wrong form, is refused by
// PostgreSQL with a data exception (SQLSTATE class 22): every retry sends
// the same values and fails the same way. Before, each package returned the
// refusal as a transient error, and the job was retried with backoff to its
// last attempt instead of going to the dead-letter queue at once.
func TestMalformedValueIsPermanent(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.Schema(t, 2)
	pgtest.Exec(t, pool,
		`CREATE TABLE items (id bigint PRIMARY KEY, status text NOT NULL, n bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 1, fence_token bigint, at timestamptz)`,
		`INSERT INTO items (id, status) VALUES (1, 'pending')`)
	check := func(name string, err error) {
		t.Helper()
		var pe *pgconn.PgError
		switch {
		case err == nil:
			t.Errorf("%s: nil error", name)
		case sdk.Classify(err) != sdk.ClassPermanent:
			t.Errorf("%s: %v classified %q, want permanent", name, err, sdk.Classify(err))
		case !errors.As(err, &pe) || !strings.HasPrefix(pe.Code, "22"):
			t.Errorf("%s: %v, want PostgreSQL's data exception in the chain", name, err)
		}
	}
	for _, key := range []string{"abc", "99999999999999999999999"} {
		for _, c := range lookupCalls(t, pool, key) {
			if c.name == "rowlock.Lock" { // the refusal aborts the transaction
				locker, _, _, _ := itemsTools(t)
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var n int64
				_, err = locker.Lock(ctx, tx, key, &n)
				_ = tx.Rollback(ctx)
				check(fmt.Sprintf("%s(%q)", c.name, key), err)
				continue
			}
			check(fmt.Sprintf("%s(%q)", c.name, key), c.call())
		}
	}
	_, versioned, fenced, flow := itemsTools(t)
	_, err := versioned.Update(ctx, pool, 1, 1, map[string]any{"at": "not a time"})
	check("optimistic.Update(at: not a time)", err)
	check("fence.Update(at: not a time)", fenced.Update(ctx, pool, 1, 1, map[string]any{"at": "not a time"}))
	_, err = flow.Transition(ctx, pool, 1, "paid", map[string]any{"at": "not a time"})
	check("state.Transition(at: not a time)", err)
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM items WHERE id = 1`).Scan(&status); err != nil || status != "pending" {
		t.Fatalf("row 1: %q, %v; want untouched", status, err)
	}
}
