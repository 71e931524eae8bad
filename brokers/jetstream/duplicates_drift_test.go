package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
)

// TestDeclareKeepsLongerDuplicates: a Broker promises that a Publish
// retried within its Options.Duplicates stores nothing twice. Another
// Broker of the queue with a shorter window declared it and shortened the
// stream's, and the first Broker's retried Publish stored the message
// again. Declaring a queue never shortens its streams' dedupe windows.
// (The short Broker's 1 s is raised to twice the delay mover's lease, still
// below the long Broker's 10 min.)
func TestDeclareKeepsLongerDuplicates(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const window = 10 * time.Minute
	long := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 500 * time.Millisecond, Duplicates: window, Logger: quiet})
	q := declare(t, long, "dupdrift")
	short := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 500 * time.Millisecond, Duplicates: time.Second, Logger: quiet})
	if got := short.Options().Duplicates; got >= window {
		t.Fatalf("the short Broker's window is %s: the test needs one below %s", got, window)
	}
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
		if got := s.CachedInfo().Config.Duplicates; got != window {
			t.Errorf("stream %s: Duplicates %s after the shorter Broker's DeclareQueue, want %s", name, got, window)
		}
	}
}
