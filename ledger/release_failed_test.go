package ledger_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// A release whose call failed may still have handed the message back: on
// RabbitMQ and JetStream a release publishes a copy at the same attempt and
// then acks the delivery, and an ack that fails after the copy was
// confirmed fails the release. The broker then delivers the message again
// at the same attempt. The failed release was recorded as retrying, a state
// that ends its attempt (rank 2), so that redelivery's start and its own
// release were dropped as older, and the row claimed a failed attempt
// waiting for a next one while the job ran, or sat released with a delay.
// A failed release is now recorded as what it was, a hand-back without an
// attempt spent (released, class settle_failed, no next attempt time),
// dated when its handler ended as a release is: the attempt that follows
// replaces it, at the same attempt or the next.
func TestFailedReleaseDoesNotHideSameAttemptRedelivery(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	b, err := memory.New(memory.Options{Lease: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	store := newStore(t, newPool(t))
	led := newLedger(t, store, ledger.Options{Linger: -1})
	q := "ledger_" + suffix()
	m := &sdk.Message{Type: "ledger.release", Body: []byte(`{}`)}
	if err := led.Publisher(b).Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	receive := func() (sdk.Delivery, time.Time) {
		t.Helper()
		ds, err := b.Receive(ctx, q, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Receive: %d deliveries, %v", len(ds), err)
		}
		return ds[0], time.Now()
	}
	row := func() *ledger.Job {
		t.Helper()
		if err := led.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		j, err := store.Job(ctx, m.ID)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}

	// Attempt 1 is handed back (a RetryAfter); the broker takes the
	// release, but the call reports a failure, as an ack lost after the
	// copy was confirmed does.
	d1, received := receive()
	hctx := led.Start(ctx, d1)
	began := time.Now()
	time.Sleep(2 * time.Millisecond)
	ran := time.Since(began)
	if err := d1.(sdk.Releaser).Release(ctx, 0); err != nil {
		t.Fatal(err)
	}
	errAckLost := errors.New("channel closed before the ack")
	cause := sdk.RetryAfter(errors.New("rate limited"), 0)
	led.Settled(hctx, d1, sdk.Settlement{Action: sdk.ActionRelease, Cause: cause, Class: sdk.Classify(cause),
		Err: errAckLost, Duration: ran, Received: received})
	j := row()
	if j.Status != ledger.StatusReleased || j.Attempts != 1 || j.ErrorClass != ledger.ClassSettleFailed ||
		!strings.Contains(j.LastError, "release failed: "+errAckLost.Error()) || !j.NextAttemptAt.IsZero() {
		t.Errorf("after the failed release: %s at attempt %d, class %q, error %q, next attempt %v; "+
			"want released at attempt 1, class settle_failed, the release's error, no next attempt time",
			j.Status, j.Attempts, j.ErrorClass, j.LastError, j.NextAttemptAt)
	}

	// The broker hands it again at the same attempt: the row shows it
	// running.
	d2, received := receive()
	if d2.Attempt() != d1.Attempt() {
		t.Fatalf("redelivered at attempt %d, want %d (a release consumes none)", d2.Attempt(), d1.Attempt())
	}
	hctx = led.Start(ctx, d2)
	if j := row(); j.Status != ledger.StatusRunning || j.Attempts != 1 {
		t.Fatalf("redelivery after the failed release: row %s at attempt %d (%q); want running at attempt 1",
			j.Status, j.Attempts, j.LastError)
	}

	// And its own release, which succeeds, shows with its next attempt.
	if err := d2.(sdk.Releaser).Release(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	led.Settled(hctx, d2, sdk.Settlement{Action: sdk.ActionRelease, Delay: time.Hour, Cause: cause,
		Class: sdk.Classify(cause), Received: received})
	if j := row(); j.Status != ledger.StatusReleased || j.Attempts != 1 || j.NextAttemptAt.IsZero() {
		t.Fatalf("after the redelivery's release: row %s at attempt %d, next attempt %v; want released at attempt 1 with a next attempt",
			j.Status, j.Attempts, j.NextAttemptAt)
	}
}
