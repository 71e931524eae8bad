package jetstream_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/berthq/berth/sdk"
)

// A message that fits the server's max_payload only without the Nats-Msg-Id
// header is refused with a MessageTooLargeError before anything of the batch
// is sent. The size check left that header out: the message then failed in
// nats.go ("maximum payload exceeded") as a PublishError, after the batch's
// other messages were stored.
func TestMessageTooLargeCountsMsgIDHeader(t *testing.T) {
	probe := newBroker(t, testOpts)
	limit := int(probe.Conn().MaxPayload())
	opts := testOpts
	opts.MaxMessageSize = limit
	b := newBroker(t, opts)
	q := declare(t, b, "maxpayload")
	ctx := t.Context()
	stored := 0
	// The body sizes around the one whose headers and body, Nats-Msg-Id
	// left out, are exactly max_payload, and down to below the limit
	// Publish sets, which keeps a few hundred bytes for the copies berth
	// stores of a message (a dead letter, a release, a redrive).
	for n := limit - 320; n <= limit-40; n++ {
		small := &sdk.Message{ID: fmt.Sprintf("small-%d", n), Body: []byte("x")}
		big := &sdk.Message{ID: fmt.Sprintf("big-%d", n), Body: make([]byte, n)}
		err := b.Publish(ctx, q, small, big)
		var tl *sdk.MessageTooLargeError
		switch {
		case err == nil:
			stored += 2
		case errors.As(err, &tl):
			if tl.ID != big.ID || tl.Limit >= limit || tl.Size <= tl.Limit {
				t.Errorf("body %d: %v", n, err)
			}
		default:
			t.Errorf("body %d: Publish = %v, want nil or a MessageTooLargeError", n, err)
		}
		res, err := b.PublishAsync(ctx, q, &sdk.Message{ID: fmt.Sprintf("async-%d", n), Body: make([]byte, n)})
		if err == nil {
			err = res.Wait(ctx)
		}
		if err != nil && !errors.As(err, &tl) {
			t.Errorf("body %d: PublishAsync = %v, want nil or a MessageTooLargeError", n, err)
		}
	}
	if stored == 0 {
		t.Fatal("no body size fitted")
	}
}
