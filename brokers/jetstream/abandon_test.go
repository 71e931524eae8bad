package jetstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestPublishAbandonedKeepsItsSlots: a Publish whose ctx ends before its
// acks arrive leaves those messages in flight, and they count against
// MaxInFlight until their acks (or the ack timeout) come. publishWire used
// to give their slots back at once: a few such calls filled nats.go's own
// bound of pending acks (4 × MaxInFlight), and the next PublishAsync, finding
// a slot free, failed after 200 ms with nats.go's "too many outstanding async
// published messages", an error that does not wrap ErrUnavailable, instead
// of waiting for an ack as its back-pressure promises.
func TestPublishAbandonedKeepsItsSlots(t *testing.T) {
	const inFlight = 4
	opts := jetstream.Options{MaxInFlight: inFlight}
	direct := newBroker(t, opts)
	q := declare(t, direct, "abandon")
	u, p := integration.ProxyURL(t, integration.NATSURL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b, err := jetstream.Connect(ctx, u.String(), jetstream.ConnectOptions{Name: "berth-test-abandon"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Publish(ctx, q, &sdk.Message{Type: "warm"}); err != nil { // queue known, reply subscription made
		t.Fatal(err)
	}

	// Acks held: every Publish below gives up with its messages in flight.
	p.FreezeReplies()
	for range 5 {
		msgs := make([]*sdk.Message, inFlight)
		for i := range msgs {
			msgs[i] = &sdk.Message{Type: "abandoned"}
		}
		short, stop := context.WithTimeout(ctx, 100*time.Millisecond)
		err := b.Publish(short, q, msgs...)
		stop()
		if !errors.Is(err, context.DeadlineExceeded) {
			p.Thaw()
			t.Fatalf("Publish with its acks held: %v; want context.DeadlineExceeded", err)
		}
	}
	type outcome struct {
		res *sdk.PublishResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := b.PublishAsync(ctx, q, &sdk.Message{Type: "after"})
		done <- outcome{res, err}
	}()
	time.Sleep(500 * time.Millisecond) // past nats.go's 200 ms stall
	p.Thaw()
	o := <-done
	if o.err != nil {
		t.Fatalf("PublishAsync with MaxInFlight messages of abandoned Publish calls in flight: %v; want it to wait for their acks", o.err)
	}
	if err := o.res.Wait(ctx); err != nil {
		t.Fatalf("result: %v", err)
	}
}
