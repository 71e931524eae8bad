package ledger_test

import (
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// A release is reported once the broker has taken it (sdk.Observer), and a
// release does not consume an attempt: the broker may hand the message
// again, at the same attempt, and its next Start be recorded before the
// release's Settled. The row must show the redelivery running, not the
// release that came before it.
func TestReleaseReportedAfterRedeliveryStartsDoesNotHideIt(t *testing.T) {
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
	// First delivery: started, its handler releases it (a shutdown) after
	// a while, as a Worker would.
	d1, received := receive()
	hctx := led.Start(ctx, d1)
	began := time.Now()
	time.Sleep(2 * time.Millisecond)
	ran := time.Since(began)
	if err := d1.(sdk.Releaser).Release(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// The broker hands it again at once; that attempt starts before the
	// first Worker goroutine gets to report its release.
	d2, _ := receive()
	if d2.Attempt() != d1.Attempt() {
		t.Fatalf("redelivered at attempt %d, want %d (a release consumes none)", d2.Attempt(), d1.Attempt())
	}
	led.Start(ctx, d2)
	time.Sleep(2 * time.Millisecond) // the report comes later on the clock
	led.Settled(hctx, d1, sdk.Settlement{Action: sdk.ActionRelease, Duration: ran, Received: received})
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	j, err := store.Job(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != ledger.StatusRunning || j.Attempts != 1 {
		t.Fatalf("row: %s at attempt %d, want running at attempt 1 (the redelivery runs)", j.Status, j.Attempts)
	}

	// The release still moves the row past its own start when nothing
	// came after it.
	m2 := &sdk.Message{Type: "ledger.release", Body: []byte(`{}`)}
	if err := led.Publisher(b).Publish(ctx, q, m2); err != nil {
		t.Fatal(err)
	}
	d3, received := receive()
	hctx = led.Start(ctx, d3)
	if err := d3.(sdk.Releaser).Release(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	led.Settled(hctx, d3, sdk.Settlement{Action: sdk.ActionRelease, Delay: time.Hour, Received: received})
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if j, err := store.Job(ctx, m2.ID); err != nil || j.Status != ledger.StatusReleased {
		t.Fatalf("row: %+v, %v; want released", j, err)
	}
}
