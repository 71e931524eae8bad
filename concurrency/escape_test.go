package concurrency_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestRefusedValuesAreEscapedInErrors: a key or a value to set comes from a
// message, and PostgreSQL's refusal of one it cannot read quotes it back raw
// ("invalid input syntax for type bigint: "1<newline>…""); a key of a type
// that is not a string (pgtype.Text) was printed by fmt as is; a status
// column holding text no transition table declares was printed as is.
// Every package quotes a string key in its errors so that a newline or a
// terminal escape in it can neither forge a log line nor reach a terminal
// raw; these three ways round it let them through. Now the error text
// escapes them, and the error is still permanent with PostgreSQL's error in
// its chain.
func TestRefusedValuesAreEscapedInErrors(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.Schema(t, 2)
	pgtest.Exec(t, pool,
		`CREATE TABLE items (id bigint PRIMARY KEY, status text NOT NULL, n bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 1, fence_token bigint, at timestamptz)`,
		`INSERT INTO items (id, status) VALUES (1, 'pending'), (2, E'held\n\x1b[31mlevel=ERROR msg=forged')`)
	const raw = "\n\x1b\u202e"
	check := func(name string, err error, wantPermanent bool) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s: nil error", name)
		case wantPermanent && sdk.Classify(err) != sdk.ClassPermanent:
			t.Errorf("%s: %v classified %q, want permanent", name, err, sdk.Classify(err))
		case strings.ContainsAny(err.Error(), raw):
			t.Errorf("%s: error text %q has a raw control or bidi character", name, err.Error())
		}
	}
	keys := []any{
		"1\nlevel=ERROR msg=forged",
		"1\x1b[31m",
		"1\u202e",
		pgtype.Text{String: "1\nlevel=ERROR", Valid: true},
	}
	locker, versioned, fenced, flow := itemsTools(t)
	for _, key := range keys {
		for _, c := range lookupCalls(t, pool, key) {
			if c.name == "rowlock.Lock" { // the refusal aborts the transaction
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var n int64
				_, err = locker.Lock(ctx, tx, key, &n)
				_ = tx.Rollback(ctx)
				check(fmt.Sprintf("%s(%q)", c.name, key), err, true)
				continue
			}
			check(fmt.Sprintf("%s(%q)", c.name, key), c.call(), true)
		}
	}
	at := map[string]any{"at": "not a time\n\x1b[2J\u202e"}
	_, err := versioned.Update(ctx, pool, 1, 1, at)
	check("optimistic.Update(at)", err, true)
	check("fence.Update(at)", fenced.Update(ctx, pool, 1, 1, at), true)
	_, err = flow.Transition(ctx, pool, 1, "paid", at)
	check("state.Transition(at)", err, true)
	_, err = flow.Transition(ctx, pool, 2, "paid", nil)
	check("state.Transition(from an undeclared status)", err, true)
}
