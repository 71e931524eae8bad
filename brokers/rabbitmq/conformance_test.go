package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/brokers/brokertest"
	"github.com/berthq/berth/sdk"
)

// unsupported lists what RabbitMQ cannot do, with the reason.
var unsupported = map[brokertest.Capability]string{
	brokertest.CapLease:       "RabbitMQ has no lease: a delivery is held until it is settled or its channel closes",
	brokertest.CapLeaseLost:   "no lease to expire; a closed channel is covered by TestSettleAfterChannelLoss",
	brokertest.CapExtendLease: "no lease to extend (consumer_timeout is server-wide)",
	brokertest.CapStats:       "AMQP 0-9-1 reports only ready messages and consumers; in-flight counts and message ages need the management plugin",
}

func harness(url string, opts Options) brokertest.Harness {
	return brokertest.Harness{
		New: func(t *testing.T) sdk.Broker {
			return newBroker(t, url, opts)
		},
		Queue: func(t *testing.T, b sdk.Broker) string {
			q := testQueue(t, url)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			if err := b.(*Broker).DeclareQueue(ctx, q); err != nil {
				t.Fatalf("DeclareQueue: %v", err)
			}
			return q
		},
		Lease:          time.Second,
		MaxDeliveries:  opts.MaxDeliveries,
		MaxMessageSize: opts.MaxMessageSize,
		Abandon: func(t *testing.T, b sdk.Broker, d sdk.Delivery) {
			d.(*delivery).abandon()
		},
		Unsupported: unsupported,
		// A queue is declared on first use, unless NoDeclare: then the
		// server's 404 makes Publish and Receive fail with ErrNotFound.
		Undeclared: brokertest.UndeclaredCreated,
		NewNoDeclare: func(t *testing.T) sdk.Broker {
			o := opts
			o.NoDeclare = true
			return newBroker(t, url, o)
		},
		As: func(err error) bool {
			var ae *amqp.Error
			return errors.As(err, &ae)
		},
		Peer: func(t *testing.T, _ sdk.Broker) sdk.Broker {
			return newBroker(t, url, opts)
		},
		Faulty: func(t *testing.T) (sdk.Broker, func()) {
			p, purl := newProxy(t, url)
			o := opts
			o.Logger = quiet
			o.Reconnect = sdk.Backoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond}
			return newBroker(t, purl, o), p.Cut
		},
	}
}

func TestConformanceQuorum(t *testing.T) {
	url := serverURL(t)
	brokertest.Run(t, harness(url, Options{QueueType: Quorum, MaxDeliveries: 3, MaxMessageSize: 1 << 20}))
}

func TestConformanceClassic(t *testing.T) {
	url := serverURL(t)
	h := harness(url, Options{QueueType: Classic, MaxMessageSize: 1 << 20})
	h.Unsupported = map[brokertest.Capability]string{
		brokertest.CapMaxDeliveries: "classic queues have no delivery limit (x-delivery-limit is a quorum queue feature)",
	}
	for c, r := range unsupported {
		h.Unsupported[c] = r
	}
	brokertest.Run(t, h)
}
