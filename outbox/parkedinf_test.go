package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestParkedInfiniteTimes: parked rows whose created_at or parked_at was
// set to ±infinity by hand are listed with the others, the infinity said
// in CreatedAtInfinity or ParkedAtInfinity. Before, pgx could not scan an
// infinity into a time.Time, and one such row failed the whole Parked
// call (and so `berth outbox list`), hiding every parked row.
func TestParkedInfiniteTimes(t *testing.T) {
	ctx := context.Background()
	pool, box, _, schema := setupSchema(t, outbox.Options{})
	table := pgx.Identifier{schema, "berth_outbox"}.Sanitize()
	for _, typ := range []string{"finite", "created+inf", "created-inf", "parked+inf", "parked-inf"} {
		add(t, pool, box, "q", &sdk.Message{Type: typ})
	}
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET parked_at = clock_timestamp(), last_error = 'refused',
created_at = CASE job_type WHEN 'created+inf' THEN 'infinity' WHEN 'created-inf' THEN '-infinity' ELSE created_at END`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET parked_at = CASE job_type WHEN 'parked+inf' THEN 'infinity'::timestamptz ELSE '-infinity' END
WHERE job_type IN ('parked+inf', 'parked-inf')`); err != nil {
		t.Fatal(err)
	}
	parked, err := box.Parked(ctx, 0)
	if err != nil {
		t.Fatalf("Parked with rows at ±infinity: %v", err)
	}
	if len(parked) != 5 {
		t.Fatalf("Parked: %d rows, want 5", len(parked))
	}
	type want struct{ created, parked pgtype.InfinityModifier }
	wants := map[string]want{
		"finite":      {pgtype.Finite, pgtype.Finite},
		"created+inf": {pgtype.Infinity, pgtype.Finite},
		"created-inf": {pgtype.NegativeInfinity, pgtype.Finite},
		"parked+inf":  {pgtype.Finite, pgtype.Infinity},
		"parked-inf":  {pgtype.Finite, pgtype.NegativeInfinity},
	}
	for _, p := range parked {
		w, ok := wants[p.Message.Type]
		if !ok {
			t.Fatalf("unexpected row %+v", p)
		}
		delete(wants, p.Message.Type)
		if p.CreatedAtInfinity != w.created || p.ParkedAtInfinity != w.parked {
			t.Errorf("row %s: created %s, parked %s; want %s, %s", p.Message.Type, p.CreatedAtInfinity, p.ParkedAtInfinity, w.created, w.parked)
		}
		// A finite time is the row's; an infinite one is the zero time.
		for _, c := range []struct {
			name string
			at   time.Time
			inf  pgtype.InfinityModifier
		}{{"created_at", p.CreatedAt, p.CreatedAtInfinity}, {"parked_at", p.ParkedAt, p.ParkedAtInfinity}} {
			if (c.inf == pgtype.Finite) == c.at.IsZero() {
				t.Errorf("row %s: %s %v with infinity %s; want a time exactly when finite", p.Message.Type, c.name, c.at, c.inf)
			}
		}
		if p.LastError != "refused" || p.Queue != "q" {
			t.Errorf("row %s: %+v", p.Message.Type, p)
		}
	}
	// They can be requeued and discarded like the others.
	if n, err := box.Discard(ctx); err != nil || n != 5 {
		t.Fatalf("Discard: %d, %v; want 5", n, err)
	}
}
