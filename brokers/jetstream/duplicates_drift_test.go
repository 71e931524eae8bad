package jetstream_test

import (
	"context"
	"errors"
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

// TestStreamLimitRefusesNotDrops: an operator bounds a queue's stream
// (MaxMsgs, to cap its disk; `berth doctor` advises discard new with it, so
// that producers see the refusal). berth declared the stream with discard
// old and wrote that back at every declaration: past the limit each
// Publish returned nil while JetStream deleted the oldest job to store it,
// a job lost without an error to anyone. The queue's stream is declared
// with discard new: a Publish past the limit fails, nothing stored is
// dropped.
func TestStreamLimitRefusesNotDrops(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b := newBroker(t, testOpts)
	q := declare(t, b, "streamlimit")
	js := rawJetStream(t)
	stream, _ := b.StreamNames(q)
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs = 2
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	fresh := newBroker(t, testOpts) // a process starting: declares the queue
	if err := fresh.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	var stored []string
	for _, id := range []string{"a", "b", "c"} {
		if err := fresh.Publish(ctx, q, &sdk.Message{ID: id}); err != nil {
			// Consumers make room: try later, as for a RabbitMQ queue's
			// reject-publish, not a refusal of the message.
			if !errors.Is(err, sdk.ErrUnavailable) {
				t.Errorf("Publish %s past the limit: %v, want an error wrapping sdk.ErrUnavailable", id, err)
			}
			continue
		}
		stored = append(stored, id)
	}
	got := receiveIDs(ctx, t, fresh, q, len(stored), 3*time.Second)
	for _, id := range stored {
		if got[id] == nil {
			t.Errorf("job %s: Publish returned nil, never delivered (dropped by the stream's limit); received %v", id, got)
		}
	}
}
