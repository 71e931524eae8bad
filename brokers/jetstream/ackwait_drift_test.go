package jetstream_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// TestDeclareKeepsLongerAckWait: two Brokers of one queue with different
// AckWaits (a rolling deploy that lowers it). Each counts its leases by its
// own AckWait, so the consumer's must never be shorter than that of a Broker
// still receiving: the second DeclareQueue shortened it, the server
// redelivered a job the first Broker still held by its clock, and that
// Broker's Ack returned nil (acking the other holder's delivery) instead of
// ErrLeaseLost.
func TestDeclareKeepsLongerAckWait(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	long := newBroker(t, jetstream.Options{AckWait: 4 * time.Second, WaitTime: 700 * time.Millisecond, Logger: quiet})
	q := declare(t, long, "ackwaitdrift")
	short := newBroker(t, jetstream.Options{AckWait: time.Second, WaitTime: 700 * time.Millisecond, Logger: quiet})
	if err := short.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	stream, _ := long.StreamNames(q)
	c, err := rawJetStream(t).Consumer(ctx, stream, "berth")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.AckWait; got != 4*time.Second {
		t.Errorf("consumer AckWait after the shorter Broker's DeclareQueue: %s, want 4s (the longer, still in use)", got)
	}

	if err := long.Publish(ctx, q, &sdk.Message{ID: "held", Type: "x"}); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(ctx, t, long, q)
	time.Sleep(1500 * time.Millisecond) // past the short AckWait, within the long one
	ds, err := short.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	err = d.Ack(ctx)
	if len(ds) > 0 && !errors.Is(err, sdk.ErrLeaseLost) {
		t.Fatalf("the server redelivered %s (attempt %d) to the other Broker, and the first holder's Ack returned %v, want ErrLeaseLost",
			ds[0].Message().ID, ds[0].Attempt(), err)
	}
	if err != nil {
		t.Fatalf("Ack within the holder's lease: %v", err)
	}
}

// TestNoDeclareShorterConsumerAckWait: a Broker with NoDeclare does not
// declare the consumer, so nothing made its AckWait the Broker's: with a
// shorter one (declared by a Broker with a shorter AckWait, or by hand), the
// server redelivered jobs the Broker still held by its clock, and their
// Acks returned nil. Receive refuses such a queue instead (Publish, which
// holds no leases, still works).
func TestNoDeclareShorterConsumerAckWait(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	short := newBroker(t, jetstream.Options{AckWait: time.Second, WaitTime: 700 * time.Millisecond, Logger: quiet})
	q := declare(t, short, "ackwaitnodecl")
	b := newBroker(t, jetstream.Options{AckWait: 4 * time.Second, WaitTime: 700 * time.Millisecond, NoDeclare: true, Logger: quiet})
	if err := b.Publish(ctx, q, &sdk.Message{ID: "held", Type: "x"}); err != nil {
		t.Fatalf("Publish (NoDeclare) to a queue whose consumer has a shorter AckWait: %v", err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err == nil {
		if len(ds) == 0 {
			t.Fatal("Receive: no delivery and no error")
		}
		time.Sleep(1500 * time.Millisecond) // past the consumer's AckWait, within the Broker's
		again, rerr := short.Receive(ctx, q, 1)
		if rerr != nil {
			t.Fatal(rerr)
		}
		ackErr := ds[0].Ack(ctx)
		if len(again) > 0 && !errors.Is(ackErr, sdk.ErrLeaseLost) {
			t.Fatalf("the server redelivered %s to another Broker after the consumer's AckWait (1s), and the NoDeclare Broker (AckWait 4s) acked it: %v",
				again[0].Message().ID, ackErr)
		}
		t.Fatalf("Receive (NoDeclare, consumer AckWait 1s, Broker AckWait 4s) delivered; want it refused")
	}
	var ae *jetstream.AckWaitError
	if !errors.As(err, &ae) || ae.Consumer != time.Second || ae.Broker != 4*time.Second {
		t.Fatalf("Receive: %v, want an *AckWaitError naming 1s and 4s", err)
	}
	if got := receiveOne(ctx, t, short, q); got.Message().ID != "held" || got.Attempt() != 1 {
		t.Errorf("the refused Receive took %s (attempt %d), want it untouched", got.Message().ID, got.Attempt())
	}
}

// TestDeclareResetsHeadersOnly: a ready consumer set to headers_only (by
// an operator's `nats consumer edit`, or another tool) delivers messages
// without their bodies. Declaring the queue did not compare that setting,
// so it stayed: handlers got empty bodies, and the copies a DeadLetter (or
// Release) stores were made from them, the original acked: the body was
// lost for good. Declaring the queue turns it off again.
func TestDeclareResetsHeadersOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b := newBroker(t, testOpts)
	q := declare(t, b, "headersonly")
	js := rawJetStream(t)
	stream, _ := b.StreamNames(q)
	c, err := js.Consumer(ctx, stream, "berth")
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	cfg.HeadersOnly = true
	if _, err := js.UpdateConsumer(ctx, stream, cfg); err != nil {
		t.Fatal(err)
	}

	fresh := newBroker(t, testOpts) // declares the queue on first use
	if err := fresh.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	body := []byte("the job's payload")
	if err := fresh.Publish(ctx, q, &sdk.Message{ID: "with-body", Type: "x", Body: body}); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(ctx, t, fresh, q)
	if got := d.Message().Body; !bytes.Equal(got, body) {
		t.Errorf("delivered body %q, want %q", got, body)
	}
	if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
		t.Fatal(err)
	}
	m, err := fresh.GetDeadLetter(ctx, q, "with-body")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Body, body) {
		t.Errorf("dead letter's body %q, want %q: the original was acked, the body lost", m.Body, body)
	}
}
