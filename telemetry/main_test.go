package telemetry_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berthq/berth/brokers/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newMemory returns a fresh memory broker closed at the end of the test.
func newMemory(t testing.TB) *memory.Broker {
	t.Helper()
	b, err := memory.New(memory.Options{Lease: 5 * time.Second, MaxDeliveries: 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}
