package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// TestDeclareKeepsLongerDuplicates: a Broker promises that a Publish
// retried within its Options.Duplicates stores nothing twice. Another
// Broker of the queue with a shorter window declared it and shortened the
// stream's, and the first Broker's retried Publish stored the message
// again. Declaring a queue never shortens its streams' dedupe windows.
func TestDeclareKeepsLongerDuplicates(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	long := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 500 * time.Millisecond, Logger: quiet})
	q := declare(t, long, "dupdrift")
	short := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 500 * time.Millisecond, Duplicates: time.Second, Logger: quiet})
	if err := short.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	js := rawJetStream(t)
	stream, dlq := long.StreamNames(q)
	for _, name := range []string{stream, dlq} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.Duplicates; got != jetstream.DefaultDuplicates {
			t.Errorf("stream %s: Duplicates %s after the shorter Broker's DeclareQueue, want %s", name, got, jetstream.DefaultDuplicates)
		}
	}

	m := func() *sdk.Message { return &sdk.Message{ID: "retried", Type: "x"} }
	if err := long.Publish(ctx, q, m()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // past the short window, well within the long one
	if err := long.Publish(ctx, q, m()); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("a Publish retried within the Broker's Duplicates window stored %d messages, want 1", n)
	}
}
