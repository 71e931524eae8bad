package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// TestGiveBackOfPoisonDeliversNoMore: a delivery past MaxDeliveries that a
// cancelled pull gives back is a poison message that reached no caller.
// The give-back carried its attempt (MaxDeliveries+1) over, but the next
// delivery clamped the carried attempt to MaxDeliveries and handed the
// message out once more. It is dead-lettered instead, never delivered
// again.
func TestGiveBackOfPoisonDeliversNoMore(t *testing.T) {
	b := newBroker(t, jetstream.Options{AckWait: time.Second, WaitTime: 300 * time.Millisecond, MaxDeliveries: 1, Logger: quiet})
	q := declare(t, b, "poisonback")
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	msgs := make([]*sdk.Message, 40)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "poison"}
	}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	// Spend each message's only attempt: received, never settled.
	for seen := 0; seen < len(msgs); {
		ds, err := b.Receive(ctx, q, len(msgs))
		if err != nil {
			t.Fatal(err)
		}
		seen += len(ds)
	}
	time.Sleep(1500 * time.Millisecond) // past the AckWait: each comes back as attempt 2
	// The pull's first message is dead-lettered; the rest, still arriving
	// when ctx ends, are given back.
	ds, err := b.Receive(newEndingCtx(ctx), q, len(msgs))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		t.Errorf("message %s delivered at attempt %d past MaxDeliveries 1", d.Message().ID, d.Attempt())
	}
	js := rawJetStream(t)
	_, dlq := b.StreamNames(q)
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		ds, err := b.Receive(ctx, q, len(msgs))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			t.Errorf("message %s delivered again at attempt %d past MaxDeliveries 1", d.Message().ID, d.Attempt())
			_ = d.Ack(ctx)
		}
		s, err := js.Stream(ctx, dlq)
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().State.Msgs >= uint64(len(msgs)) {
			break
		}
	}
	s, err := js.Stream(ctx, dlq)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != uint64(len(msgs)) {
		t.Errorf("%d dead letters, want %d", n, len(msgs))
	}
}
