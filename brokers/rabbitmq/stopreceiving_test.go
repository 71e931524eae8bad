package rabbitmq

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestStopReceivingThenReceive: StopReceiving hands back what the consumer
// holds beyond what Receive returned, at the same attempt; the delivery
// Receive returned still settles (the channel stays open); a Receive
// waiting on the queue meanwhile consumes again and gets what comes next.
func TestStopReceivingThenReceive(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Prefetch: 5, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.StopReceiving(ctx, q); err != nil { // no consumer yet: nothing to do
		t.Fatal(err)
	}
	pub := newBroker(t, url, Options{Logger: quiet})
	if err := pub.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := pub.Publish(ctx, q, &sdk.Message{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %v, %v", ds, err)
	}
	held := ds[0]
	if err := b.StopReceiving(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := held.Ack(ctx); err != nil {
		t.Fatalf("Ack of a delivery Receive returned before StopReceiving: %v", err)
	}
	seen := map[string]bool{held.Message().ID: true}
	for len(seen) < 3 {
		ds, err := b.Receive(ctx, q, 3)
		if err != nil {
			t.Fatalf("Receive after StopReceiving: %v (got %d of 3)", err, len(seen))
		}
		for _, d := range ds {
			if seen[d.Message().ID] || d.Attempt() != 1 {
				t.Errorf("message %s: seen before %v, attempt %d", d.Message().ID, seen[d.Message().ID], d.Attempt())
			}
			seen[d.Message().ID] = true
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	// A Receive waiting while StopReceiving runs wants messages: it
	// consumes again.
	got := make(chan string, 1)
	go func() {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil || len(ds) != 1 {
			got <- fmt.Sprintf("error: %v, %v", ds, err)
			return
		}
		_ = ds[0].Ack(ctx)
		got <- ds[0].Message().ID
	}()
	if err := b.StopReceiving(ctx, q); err != nil {
		t.Fatal(err)
	}
	m := &sdk.Message{Body: []byte("next")}
	if err := pub.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != m.ID {
			t.Errorf("waiting Receive got %s, want %s", id, m.ID)
		}
	case <-ctx.Done():
		t.Fatal("a Receive waiting through StopReceiving got nothing")
	}
}
