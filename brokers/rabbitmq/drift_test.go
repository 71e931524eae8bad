package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// TestReceiveDeclareDriftReported: a queue that exists with other arguments
// than the broker declares (here a classic queue where the broker declares
// quorum queues) can never be declared: the server answers
// PRECONDITION_FAILED. Receive returns that error, the server's *amqp.Error
// 406 reachable, instead of waiting for ever while its consumer retries the
// declaration in the background; Publish says the same.
func TestReceiveDeclareDriftReported(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ch := ownChannel(t, url, false)
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var ae *amqp.Error
	perr := b.Publish(ctx, q, &sdk.Message{Type: "drift"})
	if !errors.As(perr, &ae) || ae.Code != amqp.PreconditionFailed {
		t.Fatalf("Publish to a queue declared with other arguments: %v, want the 406", perr)
	}
	_, err := b.Receive(ctx, q, 1)
	if ctx.Err() != nil {
		t.Fatalf("Receive on a queue declared with other arguments waited until its ctx ended: %v", err)
	}
	ae = nil
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		t.Fatalf("Receive on a queue declared with other arguments: %v, want the 406", err)
	}
	if errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Receive: %v wraps sdk.ErrNotFound: the queue exists", err)
	}
}
