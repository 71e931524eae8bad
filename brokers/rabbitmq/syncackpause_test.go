package rabbitmq

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestSyncAckDuringPauses: with SyncAck an Ack makes a round trip on the
// consumer channel (basic.qos), and a pause and its resume make others
// there (basic.cancel, basic.consume). amqp091 matches a reply to whichever
// call reads it first, so two of them in flight at once could take each
// other's replies: the Ack failed with ErrLeaseLost although its frame went
// out, or the resume's basic.consume failed and the channel was closed
// under every delivery in flight. Acks and pauses racing must all succeed.
func TestSyncAckDuringPauses(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet, SyncAck: true, Prefetch: 20, MoveDelaysUpTo: -1})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pub := newBroker(t, url, Options{Logger: quiet, MoveDelaysUpTo: -1})
	const n = 1500
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "t"}
	}
	if err := pub.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := b.StopReceiving(ctx, q); err != nil {
				t.Errorf("StopReceiving: %v", err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	acked := 0
	var failed []error
	for acked < n && ctx.Err() == nil && len(failed) < 5 {
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		ds, err := b.Receive(rctx, q, 10)
		rcancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if err := d.Ack(ctx); err != nil {
				failed = append(failed, err)
				continue
			}
			acked++
		}
	}
	close(stop)
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("after %d acks, %d failed: %v", acked, len(failed), errors.Join(failed...))
	}
	if acked != n {
		t.Fatalf("acked %d of %d", acked, n)
	}
}
