package ledger_test

import (
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// TestSyncDeadLettersForgedFutureTime: a letter the broker dead-lettered by
// itself (its poison cap, a TTL) keeps the producer's headers, so its
// berth-last-failure may say any time. One far in the future must not
// become the row's update time: the row would sit first in every listing,
// never fall behind the retention (Purge deletes rows updated before the
// cutoff) and refuse its redrive (which applies to rows dead before it).
func TestSyncDeadLettersForgedFutureTime(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	store := newStore(t, newPool(t))
	led := newLedger(t, store, ledger.Options{Linger: -1})
	q := "ledger_" + suffix()
	id := sdk.NewID()
	started := time.Now().Add(-time.Minute)
	led.Record(ledger.Event{MessageID: id, Queue: q, Status: ledger.StatusRunning, Attempt: 1, At: started, StartedAt: started})
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	m := &sdk.Message{ID: id, Type: "t", Headers: map[string]string{
		sdk.HeaderLastFailure:      "9999-12-31T23:59:59Z", // forged by the producer
		sdk.HeaderDeadLetterReason: "delivery limit",
	}}
	if n, err := led.SyncDeadLetters(ctx, oldLetters{msgs: []*sdk.Message{m}}, q, 0); err != nil || n != 1 {
		t.Fatalf("SyncDeadLetters = %d, %v", n, err)
	}
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	j, err := store.Job(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != ledger.StatusDead {
		t.Fatalf("status %s, want dead", j.Status)
	}
	if after := time.Now().Add(time.Minute); j.UpdatedAt.After(after) {
		t.Errorf("updated_at %s taken from a forged header; want no later than now", j.UpdatedAt)
	}
	// The operator redrives it now: the ledger must say so.
	led.Record(ledger.Event{MessageID: id, Queue: q, Status: ledger.StatusRedriven, At: time.Now()})
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if j, err := store.Job(ctx, id); err != nil || j.Status != ledger.StatusRedriven {
		t.Errorf("after a redrive: %+v, %v; want redriven", j, err)
	}
}
