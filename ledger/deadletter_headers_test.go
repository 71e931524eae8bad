package ledger_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// A dead letter's attempt comes from its berth-dead-letter-attempts
// header, which a letter the broker dead-lettered itself keeps from its
// producer, and went into the integer column unclamped: 2^31 wrapped to a
// negative attempt, older than the row's running attempt 1, so the dead
// letter was ignored and the job showed running for ever; 2^32+1 wrapped
// to 1. It is now stored as the largest attempt the column holds.
func TestSyncDeadLettersAttemptBeyondInt32(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	store := newStore(t, newPool(t))
	led := newLedger(t, store, ledger.Options{Linger: -1})
	q := "ledger_" + suffix()
	running, fresh := sdk.NewID(), sdk.NewID()
	started := time.Now().Add(-time.Minute)
	led.Record(ledger.Event{MessageID: running, Queue: q, Status: ledger.StatusRunning, Attempt: 1, At: started, StartedAt: started})
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	letter := func(id string, attempts int64) *sdk.Message {
		return &sdk.Message{ID: id, Type: "t", Headers: map[string]string{
			sdk.HeaderDeadLetterReason:   "delivery limit",
			sdk.HeaderDeadLetterAttempts: strconv.FormatInt(attempts, 10),
		}}
	}
	dl := oldLetters{msgs: []*sdk.Message{letter(running, 1<<31), letter(fresh, 1<<32+1)}}
	if n, err := led.SyncDeadLetters(ctx, dl, q, 0); err != nil || n != 2 {
		t.Fatalf("SyncDeadLetters = %d, %v", n, err)
	}
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{running, fresh} {
		j, err := store.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.Status != ledger.StatusDead || j.Attempts != math.MaxInt32 {
			t.Errorf("job %s: %s at attempt %d; want dead at attempt %d (the header's attempt, clamped)", id, j.Status, j.Attempts, math.MaxInt32)
		}
	}
}

// A dead letter's reason and class are headers too, and were stored at
// whatever length they had, while the Worker's own reasons are cut to
// sdk.MaxReasonLength bytes (sdk.SanitizeReason): a producer could put
// megabytes in every row's last_error. They are now cut the same way, on
// a rune boundary.
func TestSyncDeadLettersReasonAndClassCut(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	store := newStore(t, newPool(t))
	led := newLedger(t, store, ledger.Options{Linger: -1})
	q := "ledger_" + suffix()
	id := sdk.NewID()
	long := strings.Repeat("é", 3*sdk.MaxReasonLength) // 2-byte runes: the cut (MaxReasonLength-len("…"), odd) falls mid-rune
	m := &sdk.Message{ID: id, Type: "t", Headers: map[string]string{
		sdk.HeaderDeadLetterReason:   long,
		sdk.HeaderDeadLetterClass:    long,
		sdk.HeaderDeadLetterAttempts: "3",
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
	want := sdk.SanitizeReason(long)
	if len(want) > sdk.MaxReasonLength || !utf8.ValidString(want) {
		t.Fatalf("sdk.SanitizeReason gave %d bytes, valid UTF-8 %v", len(want), utf8.ValidString(want))
	}
	for name, got := range map[string]string{"reason": j.LastError, "class": string(j.ErrorClass)} {
		if got != want {
			t.Errorf("%s stored as %d bytes (valid UTF-8: %v); want the %d bytes the Worker keeps of it", name, len(got), utf8.ValidString(got), len(want))
		}
	}
}
