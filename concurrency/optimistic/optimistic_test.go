package optimistic_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/optimistic"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func setup(t *testing.T) (*pgxpool.Pool, *optimistic.Table) {
	t.Helper()
	pool, _ := pgtest.Schema(t, 8)
	pgtest.Exec(t, pool,
		`CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, amount bigint NOT NULL, version bigint NOT NULL DEFAULT 1)`,
		`INSERT INTO orders (id, status, amount) VALUES (1, 'pending', 0)`)
	tbl, err := optimistic.New(optimistic.Options{Table: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	return pool, tbl
}

func TestNewRejectsBadIdentifiers(t *testing.T) {
	for _, o := range []optimistic.Options{
		{},
		{Table: "orders x"},
		{Table: "orders", VersionColumn: `v"`},
		{Table: "orders", KeyColumn: "id; --"},
	} {
		if _, err := optimistic.New(o); !errors.Is(err, sqlident.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", o, err)
		}
	}
	if _, err := optimistic.New(optimistic.Options{Table: "orders", KeyColumn: "v", VersionColumn: "v"}); err == nil {
		t.Error("same key and version column accepted")
	}
}

func TestUpdate(t *testing.T) {
	pool, tbl := setup(t)
	ctx := context.Background()
	var status string
	v, err := tbl.Get(ctx, pool, 1, []string{"status"}, &status)
	if err != nil || v != 1 || status != "pending" {
		t.Fatalf("Get = %d %q %v", v, status, err)
	}
	next, err := tbl.Update(ctx, pool, 1, v, map[string]any{"status": "paid", "amount": 42})
	if err != nil || next != 2 {
		t.Fatalf("Update = %d, %v; want 2, nil", next, err)
	}
	// The stale version conflicts and changes nothing.
	_, err = tbl.Update(ctx, pool, 1, v, map[string]any{"status": "pending"})
	var ce *optimistic.ConflictError
	if !errors.Is(err, optimistic.ErrVersionConflict) || !errors.As(err, &ce) || ce.Expected != 1 || ce.Actual != 2 {
		t.Fatalf("stale Update = %v, want conflict expected 1 actual 2", err)
	}
	var amount int64
	if v, err := tbl.Get(ctx, pool, 1, []string{"status", "amount"}, &status, &amount); err != nil || v != 2 || status != "paid" || amount != 42 {
		t.Fatalf("after: %d %q %d %v", v, status, amount, err)
	}
	if _, err := tbl.Update(ctx, pool, 7, 1, map[string]any{"status": "x"}); !errors.Is(err, optimistic.ErrNotFound) {
		t.Errorf("missing row: %v, want ErrNotFound", err)
	}
	if _, err := tbl.Get(ctx, pool, 7, nil); !errors.Is(err, optimistic.ErrNotFound) {
		t.Errorf("Get missing row: %v, want ErrNotFound", err)
	}
	if _, err := tbl.Update(ctx, pool, 1, 2, map[string]any{"status = 'x', amount": 1}); !errors.Is(err, sqlident.ErrInvalid) {
		t.Errorf("injected column: %v, want ErrInvalid", err)
	}
	if _, err := tbl.Update(ctx, pool, 1, 2, map[string]any{"version": 9}); err == nil {
		t.Error("setting the version column accepted")
	}
	if _, err := tbl.Get(ctx, pool, 1, []string{"status"}); err == nil {
		t.Error("Get with fewer destinations than columns accepted")
	}
}

// Two workers read the same version; the one that writes second conflicts,
// and the Retrier reloads and re-applies, so both increments land.
func TestRetrierReappliesAfterConflict(t *testing.T) {
	pool, tbl := setup(t)
	ctx := context.Background()
	var r optimistic.Retrier
	var conflicts []int
	var mu sync.Mutex
	r.OnConflict = func(_ context.Context, attempt int, err error) {
		mu.Lock()
		defer mu.Unlock()
		conflicts = append(conflicts, attempt)
	}
	read := make(chan struct{}, 2)
	proceed := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			first := true
			errs <- r.Do(ctx, func(ctx context.Context) error {
				var amount int64
				v, err := tbl.Get(ctx, pool, 1, []string{"amount"}, &amount)
				if err != nil {
					return err
				}
				if first { // both read before either writes
					first = false
					read <- struct{}{}
					<-proceed
				}
				_, err = tbl.Update(ctx, pool, 1, v, map[string]any{"amount": amount + 1})
				return err
			})
		})
	}
	<-read
	<-read
	close(proceed)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var amount int64
	if _, err := tbl.Get(ctx, pool, 1, []string{"amount"}, &amount); err != nil || amount != 2 {
		t.Fatalf("amount = %d (%v), want 2", amount, err)
	}
	if r.Conflicts() != 1 || len(conflicts) != 1 || conflicts[0] != 1 {
		t.Errorf("conflicts = %d, hook saw %v; want 1 at attempt 1", r.Conflicts(), conflicts)
	}
}

func TestRetrierIsBounded(t *testing.T) {
	r := optimistic.Retrier{MaxAttempts: 3}
	calls := 0
	err := r.Do(context.Background(), func(context.Context) error {
		calls++
		return &optimistic.ConflictError{Table: "t", Key: 1, Expected: 1, Actual: 2}
	})
	var ex *optimistic.ExhaustedError
	if !errors.As(err, &ex) || ex.Attempts != 3 || !errors.Is(err, optimistic.ErrVersionConflict) {
		t.Fatalf("Do = %v, want ExhaustedError after 3 attempts", err)
	}
	if calls != 3 || r.Conflicts() != 3 {
		t.Errorf("calls = %d, conflicts = %d; want 3, 3", calls, r.Conflicts())
	}
	other := errors.New("boom")
	if err := r.Do(context.Background(), func(context.Context) error { return other }); err != other {
		t.Errorf("non-conflict error = %v, want it returned as is", err)
	}
}

func ExampleRetrier() {
	var r optimistic.Retrier // zero value: 5 attempts
	versions := []int64{1, 2}
	err := r.Do(context.Background(), func(ctx context.Context) error {
		// Reload the row, re-apply the change, write with the version read.
		v := versions[0]
		versions = versions[1:]
		if v == 1 { // someone else wrote version 2 meanwhile
			return &optimistic.ConflictError{Table: "orders", Key: 1, Expected: 1, Actual: 2}
		}
		return nil
	})
	fmt.Println(err, r.Conflicts())
	// Output: <nil> 1
}
