package jetstream_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/brokers/brokertest"
	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

const (
	// testLease is the AckWait of the conformance brokers.
	testLease         = time.Second
	testMaxDeliveries = 3
	testMaxSize       = 512 << 10
)

// unsupported lists what JetStream cannot do, with the reason.
var unsupported = map[brokertest.Capability]string{
	brokertest.CapStats: "JetStream counts a message waiting out a NakWithDelay (Retry(d)) in the consumer's " +
		"NumAckPending, the same number as deliveries in flight, so Delayed and InFlight cannot be told apart",
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestConformance(t *testing.T) {
	opts := jetstream.Options{
		AckWait: testLease,
		// Not a multiple of AckWait: on nats-server 2.9.10 a redelivery due
		// at the moment a pull request expires is lost and the message's
		// delivery count starts again at 1 (seen in PoisonMaxDeliveries
		// about once in ten runs with both at 1 s). See the package doc.
		WaitTime:       700 * time.Millisecond,
		MaxDeliveries:  testMaxDeliveries,
		MaxMessageSize: testMaxSize,
		Logger:         quiet,
	}
	brokertest.Run(t, brokertest.Harness{
		New: func(t *testing.T) sdk.Broker { return newBroker(t, opts) },
		Queue: func(t *testing.T, b sdk.Broker) string {
			return declare(t, b.(*jetstream.Broker), "brokertest")
		},
		Lease:          testLease,
		MaxDeliveries:  testMaxDeliveries,
		MaxMessageSize: testMaxSize,
		Unsupported:    unsupported,
		WorkerMessages: 2000,
		// Publish and Receive declare a queue on first use, unless NoDeclare.
		Undeclared: brokertest.UndeclaredCreated,
		NewNoDeclare: func(t *testing.T) sdk.Broker {
			o := opts
			o.NoDeclare = true
			return newBroker(t, o)
		},
		As: func(err error) bool {
			var je natsjs.JetStreamError
			return errors.As(err, &je)
		},
		Peer: func(t *testing.T, _ sdk.Broker) sdk.Broker { return newBroker(t, opts) },
		// The broker's connection runs through integration's fault proxy, which
		// the test resets;
		// nats.go reconnects through it.
		Faulty: func(t *testing.T) (sdk.Broker, func()) {
			u, p := integration.ProxyURL(t, integration.NATSURL(t))
			purl := u.String()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			b, err := jetstream.Connect(ctx, purl, jetstream.ConnectOptions{Name: "berth-test-faulty", ReconnectWait: 50 * time.Millisecond}, opts)
			if err != nil {
				t.Fatalf("Connect through the proxy: %v", err)
			}
			t.Cleanup(func() { _ = b.Close() })
			return b, p.Reset
		},
	})
}
