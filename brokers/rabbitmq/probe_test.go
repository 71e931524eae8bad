package rabbitmq

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// TestQueueArgumentsProbe reads back the arguments berth declares, for a
// quorum and a classic queue, and never creates a missing queue.
func TestQueueArgumentsProbe(t *testing.T) {
	for _, qt := range []QueueType{Quorum, Classic} {
		t.Run(string(qt), func(t *testing.T) {
			url := serverURL(t)
			b := newBroker(t, url, Options{QueueType: qt, MaxDeliveries: 7})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			q := testQueue(t, url)
			if err := b.DeclareQueue(ctx, q); err != nil {
				t.Fatal(err)
			}
			args, err := b.QueueArguments(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			want := b.mainArgs(q)
			if qt == Classic {
				delete(want, "x-queue-type") // the default: a redeclare without it is equivalent
			}
			for k, v := range want {
				if args[k] != v {
					t.Errorf("%s = %#v, want %#v (all: %v)", k, args[k], v, args)
				}
			}
			missing := q + "_missing"
			if _, err := b.QueueArguments(ctx, missing); !errors.Is(err, sdk.ErrNotFound) {
				t.Errorf("QueueArguments of a missing queue: %v, want ErrNotFound", err)
			}
			if _, err := b.inspect(ctx, missing); !errors.Is(err, sdk.ErrNotFound) {
				t.Errorf("the probe created %s: %v", missing, err)
			}
		})
	}
}

// TestQueueArgumentsNotDurable: a queue declared not durable, or
// auto-delete (properties of queue.declare, not arguments), makes
// QueueArguments fail at the first probe with an error naming the
// property and holding the server's 406, where it put the property among
// the arguments, was answered the same way at every probe and failed
// after maxProbes declares without saying why.
func TestQueueArgumentsNotDurable(t *testing.T) {
	url := serverURL(t)
	b := newBroker(t, url, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for _, c := range []struct {
		property            string
		durable, autoDelete bool
	}{{"durable", false, false}, {"auto_delete", true, true}} {
		t.Run(c.property, func(t *testing.T) {
			q := testQueue(t, url)
			ch := ownChannel(t, url, false)
			if _, err := ch.QueueDeclare(q, c.durable, c.autoDelete, false, false, nil); err != nil {
				t.Fatal(err)
			}
			_, err := b.QueueArguments(ctx, q)
			var ae *amqp.Error
			if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || !strings.Contains(err.Error(), c.property) {
				t.Fatalf("QueueArguments of a queue declared with %s other than berth's: %v, "+
					"want an error naming it, holding the server's 406", c.property, err)
			}
		})
	}
}
