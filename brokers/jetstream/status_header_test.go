package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/berthq/berth/brokers/jetstream"
)

// TestForeignStatusHeaderIsAMessage: a message another producer stored with
// a "Status" header and no body looks, in its headers, like the status the
// server answers a pull with (404 no messages, 408 expired, 409 consumer
// deleted, ...). Receive took it for one: the message, delivered and never
// settled, was not handed out, came back after each AckWait to be dropped
// again (never delivered, never dead-lettered), and a "409 Consumer Deleted"
// one failed the Receive with a QueueDeletedError. A server status carries
// no reply subject; a delivered message always has its ack subject.
func TestForeignStatusHeaderIsAMessage(t *testing.T) {
	b := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 500 * time.Millisecond, Logger: quiet})
	q := declare(t, b, "statushdr")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, st := range []struct{ status, desc string }{{"404", "No Messages"}, {"409", "Consumer Deleted"}} {
		publishRaw(t, b, q, nats.Header{"Status": {st.status}, "Description": {st.desc}}, "")
	}
	got := map[string]bool{}
	for deadline := time.Now().Add(4 * time.Second); len(got) < 2 && time.Now().Before(deadline); {
		ds, err := b.Receive(ctx, q, 10)
		if err != nil {
			t.Fatalf("Receive: %v (received %v)", err, got)
		}
		for _, d := range ds {
			got[d.Message().Header("Status")] = true
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !got["404"] || !got["409"] {
		t.Fatalf("received the messages with Status %v, want 404 and 409", got)
	}
}
