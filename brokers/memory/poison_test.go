package memory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// TestPoisonKeepsLastError: a message the broker dead-letters at its cap
// (the Worker could not: it crashed, or ran with another cap) keeps the
// last Retry's cause after "max deliveries exceeded".
func TestPoisonKeepsLastError(t *testing.T) {
	const lease = 50 * time.Millisecond
	b := newBroker(t, memory.Options{MaxDeliveries: 2, Lease: lease})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m := &sdk.Message{Type: "t", Body: []byte("x")}
	if err := b.Publish(ctx, "q", m); err != nil {
		t.Fatal(err)
	}
	receive := func() sdk.Delivery {
		ds, err := b.Receive(ctx, "q", 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Receive: %d, %v", len(ds), err)
		}
		return ds[0]
	}
	if err := receive().Retry(ctx, 0, errors.New("ledger API: 503 (attempt 1)")); err != nil {
		t.Fatal(err)
	}
	_ = receive() // attempt 2 crashes: never settled
	var dead []*sdk.Message
	for len(dead) == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("not dead-lettered")
		case <-time.After(lease):
		}
		var err error
		if dead, err = b.ListDeadLetters(ctx, "q", 10); err != nil {
			t.Fatal(err)
		}
	}
	want := sdk.ErrMaxDeliveries.Error() + "; last error: ledger API: 503 (attempt 1)"
	if got := dead[0].Header(sdk.HeaderDeadLetterReason); got != want {
		t.Errorf("reason %q, want %q", got, want)
	}
	if got := dead[0].Header(sdk.HeaderDeadLetterClass); got != string(sdk.ClassPoison) {
		t.Errorf("class %q, want %q", got, sdk.ClassPoison)
	}
}
