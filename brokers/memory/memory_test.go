package memory_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berthq/berth/brokers/brokertest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	// A second, not the 500ms it was: several conformance cases (WorkerLongJob,
	// ExtendLease, Stats) need a stall of the test process to stay shorter
	// than most of a lease, and the suite runs beside every other package.
	testLease         = time.Second
	testMaxDeliveries = 3
	testMaxSize       = 64 << 10
)

func newBroker(t testing.TB, opts memory.Options) *memory.Broker {
	t.Helper()
	b, err := memory.New(opts)
	if err != nil {
		t.Fatalf("memory.New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, brokertest.Harness{
		New: func(t *testing.T) sdk.Broker {
			return newBroker(t, memory.Options{Lease: testLease, MaxDeliveries: testMaxDeliveries, MaxMessageSize: testMaxSize})
		},
		Lease:          testLease,
		MaxDeliveries:  testMaxDeliveries,
		MaxMessageSize: testMaxSize,
		Undeclared:     brokertest.UndeclaredCreated, // a queue exists from its first use
		Unsupported: map[brokertest.Capability]string{
			brokertest.CapPeer: "an in-memory broker's queues live in its own Broker value: " +
				"no second instance sees them, and Close drops the messages",
			brokertest.CapDriverError:    "no driver underneath: every error is berth's own",
			brokertest.CapConnectionLoss: "no connection to lose: the broker lives in the process",
		},
	})
}
