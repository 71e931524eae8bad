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

// TestRetryAtCapDeadLettersAtOnce: a Retry of the last delivery the cap
// allows dead-letters the message then, not at some later Receive. Before,
// it waited in the ready list (or the delay heap) until a consumer came:
// ListDeadLetters and Stats.DeadLettered missed it, Stats counted it Ready,
// and with no consumer left (they all failed on it) it stayed so for ever.
func TestRetryAtCapDeadLettersAtOnce(t *testing.T) {
	for _, delay := range []time.Duration{0, time.Hour} {
		b := newBroker(t, memory.Options{MaxDeliveries: 1, Lease: time.Hour})
		ctx := ctxT(t)
		m := &sdk.Message{}
		if err := b.Publish(ctx, "q", m); err != nil {
			t.Fatal(err)
		}
		if err := receiveOne(t, b, "q").Retry(ctx, delay, errors.New("boom")); err != nil {
			t.Fatal(err)
		}
		s, err := b.Stats(ctx, "q")
		if err != nil {
			t.Fatal(err)
		}
		if s.DeadLettered != 1 || s.Ready != 0 || s.Delayed != 0 || s.InFlight != 0 {
			t.Errorf("delay %s: Stats after a Retry at the cap = %+v, want only 1 dead letter", delay, s)
		}
		dead, err := b.ListDeadLetters(ctx, "q", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(dead) != 1 || dead[0].ID != m.ID {
			t.Fatalf("delay %s: ListDeadLetters = %d messages, want %s", delay, len(dead), m.ID)
		}
		want := sdk.ErrMaxDeliveries.Error() + "; last error: boom"
		if got := dead[0].Header(sdk.HeaderDeadLetterReason); got != want {
			t.Errorf("delay %s: reason %q, want %q", delay, got, want)
		}
		if got := dead[0].Header(sdk.HeaderDeadLetterAttempts); got != "1" {
			t.Errorf("delay %s: attempts %q, want 1", delay, got)
		}
	}
}
