package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// TestMoveDropsPublishExpectations: a message another producer stored on a
// queue's delayed subject with JetStream's publish expectations in its
// headers (Nats-Expected-Last-Sequence here, held when it was stored). The
// mover copied every header but two onto the ready copy, so the server
// checked the expectation again at the move, refused the copy for ever
// (the stream has moved on) and the mover nak'ed and retried it every
// second: the job was never delivered nor dead-lettered. Like every other
// copy berth stores (Release, dead letter, redrive), the move keeps no
// Nats-* header.
func TestMoveDropsPublishExpectations(t *testing.T) {
	b := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 500 * time.Millisecond, Logger: quiet})
	q := declare(t, b, "mvexpect")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	js := rawJetStream(t)
	stream, _ := b.StreamNames(q)
	delayed := "berth.d." + b.Subject(q)[len("berth.q."):]
	m := nats.NewMsg(delayed)
	m.Header.Set("Nats-Expected-Last-Sequence", "0") // true now: the stream is empty
	m.Header.Set("X-App", "kept")
	m.Data = []byte("foreign")
	pa, err := js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if pa.Stream != stream {
		t.Fatalf("stored in %s, want %s", pa.Stream, stream)
	}
	var got sdk.Delivery
	for deadline := time.Now().Add(8 * time.Second); got == nil && time.Now().Before(deadline); {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) > 0 {
			got = ds[0]
		}
	}
	if got == nil {
		t.Fatal("the delayed foreign message never became ready")
	}
	if string(got.Message().Body) != "foreign" || got.Message().Header("X-App") != "kept" {
		t.Errorf("moved message: body %q, X-App %q", got.Message().Body, got.Message().Header("X-App"))
	}
	if err := got.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
