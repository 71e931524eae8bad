package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
)

// TestShortDuplicatesCoverMoverRedelivery: the delay mover acknowledges a
// move without waiting for the answer; when that ack is lost, JetStream
// redelivers the delayed message after the delay consumer's AckWait and the
// mover stores it again with the same Nats-Msg-Id. A Broker whose
// Options.Duplicates was shorter than that AckWait declared a stream that
// no longer recognised the repeated move and stored the job twice. A
// shorter window is raised to twice the delay consumer's AckWait.
func TestShortDuplicatesCoverMoverRedelivery(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 500 * time.Millisecond, Duplicates: time.Second, Logger: quiet})
	q := declare(t, b, "moverdedupe")
	js := rawJetStream(t)
	stream, _ := b.StreamNames(q)
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(ctx, stream, "berth-delay")
	if err != nil {
		t.Fatal(err)
	}
	ackWait := c.CachedInfo().Config.AckWait
	if got := s.CachedInfo().Config.Duplicates; got < 2*ackWait {
		t.Errorf("stream %s: Duplicates %s, shorter than twice the delay consumer's AckWait %s: a move redelivered after a lost ack is stored twice", stream, got, ackWait)
	}
	if got := b.Options().Duplicates; got < 2*ackWait {
		t.Errorf("Options().Duplicates = %s, want at least %s", got, 2*ackWait)
	}
}
