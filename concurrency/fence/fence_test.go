package fence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/fence"
	"github.com/berthq/berth/internal/sqlident"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFencedWrites(t *testing.T) {
	pool, _ := pgtest.Schema(t, 2)
	pgtest.Exec(t, pool,
		`CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, fence_token bigint)`,
		`INSERT INTO accounts (id, balance) VALUES (1, 100)`)
	ctx := context.Background()
	f, err := fence.New(fence.Options{Table: "accounts"})
	if err != nil {
		t.Fatal(err)
	}
	// First writer on a NULL token; the same token may write again.
	if err := f.Update(ctx, pool, 1, 5, map[string]any{"balance": 90}); err != nil {
		t.Fatal(err)
	}
	if err := f.Check(ctx, pool, 1, 5); err != nil {
		t.Fatalf("same token again: %v", err)
	}
	// A later token wins; the earlier one is refused from then on.
	if err := f.Update(ctx, pool, 1, 7, map[string]any{"balance": 70}); err != nil {
		t.Fatal(err)
	}
	err = f.Update(ctx, pool, 1, 5, map[string]any{"balance": 999})
	var se *fence.StaleTokenError
	if !errors.Is(err, fence.ErrStaleToken) || !errors.As(err, &se) || se.Token != 5 || se.Current != 7 {
		t.Fatalf("stale write = %v, want StaleTokenError 5 < 7", err)
	}
	if err := f.Check(ctx, pool, 1, 6); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("stale check = %v, want ErrStaleToken", err)
	}
	var balance, token int64
	if err := pool.QueryRow(ctx, "SELECT balance, fence_token FROM accounts WHERE id = 1").Scan(&balance, &token); err != nil {
		t.Fatal(err)
	}
	if balance != 70 || token != 7 {
		t.Errorf("row = balance %d token %d, want 70 and 7", balance, token)
	}
	if err := f.Check(ctx, pool, 2, 9); !errors.Is(err, fence.ErrNotFound) {
		t.Errorf("missing row = %v, want ErrNotFound", err)
	}
	if err := f.Update(ctx, pool, 1, 8, map[string]any{"balance = 0 --": 1}); !errors.Is(err, sqlident.ErrInvalid) {
		t.Errorf("injected column = %v, want ErrInvalid", err)
	}
	if err := f.Update(ctx, pool, 1, 8, map[string]any{"fence_token": 1}); err == nil {
		t.Error("setting the token column accepted")
	}
}

func TestNewRejectsBadIdentifiers(t *testing.T) {
	for _, o := range []fence.Options{{}, {Table: "a b"}, {Table: "t", TokenColumn: "x;"}} {
		if _, err := fence.New(o); !errors.Is(err, sqlident.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", o, err)
		}
	}
	if _, err := fence.New(fence.Options{Table: "t", KeyColumn: "k", TokenColumn: "k"}); err == nil {
		t.Error("same key and token column accepted")
	}
}
