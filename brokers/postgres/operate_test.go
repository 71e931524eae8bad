package postgres_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// A redrive of chosen IDs reads those rows, not every dead letter of the
// queue: `berth dlq redrive` calls it once per page, so reading the whole
// queue each time made a 100,000-letter redrive quadratic (688 ms per page
// of 500 once PostgreSQL used a generic plan, against 19 ms). The table's
// own counters tell how many rows the statement fetched.
func TestRedriveByIDReadsOnlyThoseRows(t *testing.T) {
	ctx := testCtx(t)
	pool := newPool(t, "redrive-by-id", 1) // one connection: its statistics can be flushed on demand
	b := newBroker(t, pool, postgres.Options{DisableListen: true})
	const n = 3000
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "t", Body: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	if err := b.Publish(ctx, "q", msgs...); err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{b.Schema(), "jobs"}.Sanitize()
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET status = 'dead_letter'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+table); err != nil { // a table in use has statistics
		t.Fatal(err)
	}
	// pgx prepares its statements and PostgreSQL moves a statement to a
	// generic plan after five runs; force that plan now (the pool's one
	// connection keeps the setting).
	if _, err := pool.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	fetched := func() int64 {
		t.Helper()
		// Flush this connection's pending statistics, then read them fresh.
		if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		var v int64
		err := pool.QueryRow(ctx, `SELECT pg_stat_clear_snapshot()::text, COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0)
			FROM pg_stat_user_tables WHERE relid = $1::regclass`, table).Scan(new(string), &v)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := fetched()
	ids := []string{msgs[10].ID, msgs[1500].ID, msgs[2999].ID}
	if got, err := b.RedriveDeadLetters(ctx, "q", ids...); err != nil || got != 3 {
		t.Fatalf("redrive: %d %v", got, err)
	}
	if read := fetched() - before; read > 100 {
		t.Fatalf("redriving 3 of %d dead letters read %d rows", n, read)
	}
}

// An ID no message can have on this broker (a NUL, invalid UTF-8: Publish
// refuses them), as a URL or a JSON body can carry it, is not found: not a
// database error that a caller reports as a failure of the broker.
func TestUnstorableIDNotFound(t *testing.T) {
	ctx := testCtx(t)
	b := newBroker(t, newPool(t, "unstorable-id", 2), postgres.Options{DisableListen: true})
	ids := publishN(t, b, "q", 1)
	ds := receiveN(t, b, "q", 1)
	if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("declined"))); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"\xff", "a\x00b"} {
		if _, err := b.GetDeadLetter(ctx, "q", bad); !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("GetDeadLetter(%q) = %v, want ErrNotFound", bad, err)
		}
		if n, err := b.RedriveDeadLetters(ctx, "q", ids[0], bad); n != 0 || !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("RedriveDeadLetters(%q) = %d, %v, want 0, ErrNotFound", bad, n, err)
		}
		if n, err := b.DeleteDeadLetters(ctx, "q", ids[0], bad); n != 0 || !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("DeleteDeadLetters(%q) = %d, %v, want 0, ErrNotFound", bad, n, err)
		}
	}
	if _, err := b.GetDeadLetter(ctx, "q\xff", ids[0]); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("GetDeadLetter of an invalid queue name = %v, want ErrInvalidQueue", err)
	}
	if st, err := b.Stats(ctx, "q"); err != nil || st.DeadLettered != 1 {
		t.Errorf("the dead letter was changed: %+v, %v", st, err)
	}
}
