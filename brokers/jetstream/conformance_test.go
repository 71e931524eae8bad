package jetstream_test

import (
	"testing"
	"time"

	"github.com/berthq/berth/brokers/brokertest"
	"github.com/berthq/berth/brokers/jetstream"
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

func TestConformance(t *testing.T) {
	opts := jetstream.Options{
		AckWait:        testLease,
		WaitTime:       time.Second,
		MaxDeliveries:  testMaxDeliveries,
		MaxMessageSize: testMaxSize,
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
	})
}
