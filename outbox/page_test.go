package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// refusingPublisher refuses every message, so the relay parks them.
type refusingPublisher struct{}

func (refusingPublisher) Publish(context.Context, string, ...*sdk.Message) error {
	return sdk.Permanent(errors.New("refused"))
}

func TestParkedIDs(t *testing.T) {
	pool, box, _ := setup(t)
	ctx := context.Background()
	if ids, err := box.ParkedIDs(ctx, 0, 10); err != nil || len(ids) != 0 {
		t.Fatalf("empty outbox: %v %v", ids, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		if err := box.Add(ctx, tx, "emails", &sdk.Message{Type: "email", Body: fmt.Appendf(nil, `{"n":%d}`, i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A pending row is not parked.
	if ids, err := box.ParkedIDs(ctx, 0, 10); err != nil || len(ids) != 0 {
		t.Fatalf("pending rows listed as parked: %v %v", ids, err)
	}
	_, _ = box.RelayOnce(ctx, refusingPublisher{}, outbox.RelayOptions{MaxAttempts: 1})
	parked, err := box.Parked(ctx, 0)
	if err != nil || len(parked) != 7 {
		t.Fatalf("parked %d, %v", len(parked), err)
	}
	var want []int64
	for _, p := range parked {
		want = append(want, p.ID)
	}
	// Pages of 3: 3, 3, 1, then an empty page.
	var got []int64
	after, pages := int64(0), 0
	for {
		ids, err := box.ParkedIDs(ctx, after, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > 3 {
			t.Fatalf("page of %d, limit 3", len(ids))
		}
		if len(ids) == 0 {
			break
		}
		pages++
		got = append(got, ids...)
		after = ids[len(ids)-1]
	}
	if !slices.Equal(got, want) || pages != 3 {
		t.Fatalf("paged %v in %d pages, want %v in 3", got, pages, want)
	}
	// A requeued row is no longer listed.
	if _, err := box.Requeue(ctx, want[0]); err != nil {
		t.Fatal(err)
	}
	if ids, err := box.ParkedIDs(ctx, 0, 100); err != nil || !slices.Equal(ids, want[1:]) {
		t.Fatalf("after requeue: %v %v, want %v", ids, err, want[1:])
	}
	if _, err := box.ParkedIDs(ctx, 0, 0); err == nil {
		t.Fatal("limit 0 accepted")
	}
}

// ParkedIDsUntil leaves out the rows parked after until, whatever their id
// (a row requeued and parked again keeps its low id), and keeps those whose
// parked_at is ±infinity (written by hand).
func TestParkedIDsUntil(t *testing.T) {
	pool, box, _, schema := setupSchema(t, outbox.Options{})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := box.Add(ctx, tx, "emails", &sdk.Message{Type: "email", Body: fmt.Appendf(nil, `{"n":%d}`, i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_, _ = box.RelayOnce(ctx, refusingPublisher{}, outbox.RelayOptions{MaxAttempts: 1})
	all, err := box.ParkedIDs(ctx, 0, 10)
	if err != nil || len(all) != 3 {
		t.Fatalf("parked %v %v", all, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE "`+schema+`".berth_outbox SET parked_at = 'infinity' WHERE id = $1`, all[2]); err != nil {
		t.Fatal(err)
	}
	var until time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&until); err != nil {
		t.Fatal(err)
	}
	// The lowest row is requeued and parked again, after until.
	if _, err := box.Requeue(ctx, all[0]); err != nil {
		t.Fatal(err)
	}
	_, _ = box.RelayOnce(ctx, refusingPublisher{}, outbox.RelayOptions{MaxAttempts: 1})
	if ids, err := box.ParkedIDs(ctx, 0, 10); err != nil || !slices.Equal(ids, all) {
		t.Fatalf("ParkedIDs %v %v, want %v", ids, err, all)
	}
	if ids, err := box.ParkedIDsUntil(ctx, 0, 10, until); err != nil || !slices.Equal(ids, all[1:]) {
		t.Fatalf("ParkedIDsUntil %v %v, want %v (not %d, parked after until)", ids, err, all[1:], all[0])
	}
}
