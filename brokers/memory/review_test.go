package memory_test

import (
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// A receiver waiting for a far lease end is woken when ExtendLease moves
// that end nearer: the message comes back at the shortened lease, not at the
// old one.
func TestWaitingReceiverSeesShortenedLease(t *testing.T) {
	b := newBroker(t, memory.Options{Lease: time.Hour})
	ctx := ctxT(t)
	m := &sdk.Message{}
	if err := b.Publish(ctx, "q", m); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(t, b, "q") // leased for an hour
	got := make(chan sdk.Delivery, 1)
	go func() {
		ds, err := b.Receive(t.Context(), "q", 1) // waits for the hour-long lease
		if err == nil {
			got <- ds[0]
		}
		close(got)
	}()
	time.Sleep(20 * time.Millisecond)
	if err := d.ExtendLease(ctx, 30*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	select {
	case d2 := <-got:
		if d2 == nil || d2.Message().ID != m.ID || d2.Attempt() != 2 {
			t.Fatalf("got %v, want %s attempt 2", d2, m.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiting Receive did not see the shortened lease")
	}
}

// OldestAge is the age of the oldest ready message even when a delayed
// message became due before a later publish but nobody looked at the queue
// in between.
func TestOldestAgeCountsLazilyPromoted(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	if err := b.Publish(ctx, "q", &sdk.Message{Delay: 10 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // due for 190ms, not yet promoted
	if err := b.Publish(ctx, "q", &sdk.Message{}); err != nil {
		t.Fatal(err)
	}
	s, err := b.Stats(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if s.Ready != 2 || s.OldestAge < 150*time.Millisecond {
		t.Errorf("Stats = %+v, want 2 ready, the oldest ready for at least 150ms", s)
	}
}

// A message whose last allowed lease ran out is a dead letter for
// RedriveDeadLetters too, not only for ListDeadLetters.
func TestRedriveSeesExpiredPoison(t *testing.T) {
	b := newBroker(t, memory.Options{Lease: 20 * time.Millisecond, MaxDeliveries: 1})
	ctx := ctxT(t)
	m := &sdk.Message{}
	if err := b.Publish(ctx, "q", m); err != nil {
		t.Fatal(err)
	}
	_ = receiveOne(t, b, "q") // never settled
	time.Sleep(60 * time.Millisecond)
	n, err := b.RedriveDeadLetters(ctx, "q")
	if err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters = %d, %v; want 1, nil", n, err)
	}
	d := receiveOne(t, b, "q")
	if d.Message().ID != m.ID || d.Attempt() != 1 {
		t.Errorf("got %s attempt %d, want %s attempt 1", d.Message().ID, d.Attempt(), m.ID)
	}
}

// Receive on a closed broker says so, whatever the queue name.
func TestReceiveAfterCloseInvalidName(t *testing.T) {
	b := newBroker(t, memory.Options{})
	_ = b.Close()
	if _, err := b.Receive(ctxT(t), "no spaces", 1); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("Receive after Close: %v, want ErrClosed", err)
	}
}
