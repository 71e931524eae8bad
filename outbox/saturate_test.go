package outbox_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// TestFailureCountsSaturate: a row whose attempts and refusals were set by
// hand to the integer maximum fails again; the failure's UPDATE saturates
// them rather than overflowing. Before, the UPDATE failed ("integer out of
// range"), the pass rolled back, and the rows published with it were never
// deleted: every pass published them again, for ever.
func TestFailureCountsSaturate(t *testing.T) {
	ctx := context.Background()
	pool, box, _, schema := setupSchema(t, outbox.Options{})
	table := pgx.Identifier{schema, "berth_outbox"}.Sanitize()
	b, err := memory.New(memory.Options{MaxMessageSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	good1, bad, good2 := &sdk.Message{Type: "a"}, &sdk.Message{Type: "big", Body: make([]byte, 2048)}, &sdk.Message{Type: "b"}
	add(t, pool, box, "q", good1, bad, good2)
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET attempts = 2147483647, refusals = 2147483647 WHERE message_id = $1`, bad.ID); err != nil {
		t.Fatal(err)
	}
	opts := outbox.RelayOptions{Backoff: sdk.Backoff{Base: time.Hour, Max: time.Hour}}
	n, err := box.RelayOnce(ctx, b, opts)
	if n != 2 || !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Fatalf("RelayOnce = %d, %v; want the 2 good rows published and only the refusal reported", n, err)
	}
	drain(t, b, "q", 2)
	if p, err := box.Pending(ctx); err != nil || p != 0 {
		t.Fatalf("pending %d, %v; want 0 (the refused row parked): the published rows must be deleted", p, err)
	}
	var attempts, refusals int64
	var parked bool
	if err := pool.QueryRow(ctx, `SELECT attempts, refusals, parked_at IS NOT NULL FROM `+table+` WHERE message_id = $1`, bad.ID).
		Scan(&attempts, &refusals, &parked); err != nil {
		t.Fatal(err)
	}
	if attempts != math.MaxInt32 || refusals != math.MaxInt32 || !parked {
		t.Fatalf("refused row: attempts %d, refusals %d, parked %v; want both saturated at %d, parked", attempts, refusals, parked, math.MaxInt32)
	}
	// An outage counts attempts only (not refusals); they saturate too.
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET parked_at = NULL, available_at = now(), refusals = 0 WHERE message_id = $1`, bad.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := box.RelayOnce(ctx, &failing{Publisher: b, left: 1}, opts); n != 0 || !errors.Is(err, errDown) {
		t.Fatalf("RelayOnce in an outage = %d, %v; want the outage reported", n, err)
	}
	if err := pool.QueryRow(ctx, `SELECT attempts, refusals, parked_at IS NOT NULL FROM `+table+` WHERE message_id = $1`, bad.ID).
		Scan(&attempts, &refusals, &parked); err != nil {
		t.Fatal(err)
	}
	if attempts != math.MaxInt32 || refusals != 0 || parked {
		t.Fatalf("row after an outage: attempts %d, refusals %d, parked %v; want %d, 0, not parked", attempts, refusals, parked, math.MaxInt32)
	}
}
