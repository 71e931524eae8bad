package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/berthq/berth/integration"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		// A child process of a fault test: no tests and no leak check (it
		// is SIGKILLed or exits on purpose).
		helperProcess(role)
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// testPrefix starts every queue these tests create, so leftovers are easy
// to find and delete.
const testPrefix = "berth_rmqtest_"

// testQueue returns a unique queue name and deletes it, with its dead-letter
// and delay queues, when the test ends.
func testQueue(t testing.TB, url string) string {
	t.Helper()
	var p [6]byte
	_, _ = rand.Read(p[:])
	q := testPrefix + hex.EncodeToString(p[:])
	t.Cleanup(func() { deleteQueues(t, url, q) })
	return q
}

// deleteQueues deletes q and its companions through a connection of its
// own (the test's broker may be closed already).
func deleteQueues(t testing.TB, url, q string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Errorf("cleanup: connect: %v", err)
		return
	}
	defer conn.Close()
	names := []string{q, DeadLetterQueue(q)}
	for _, ttl := range DefaultDelayBuckets {
		names = append(names, DelayQueue(q, ttl))
	}
	for _, n := range names {
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("cleanup: channel: %v", err)
			return
		}
		_, _ = ch.QueueDelete(n, false, false, false)
		_ = ch.Close()
	}
}

// newBroker returns a broker on the test server, closed when the test ends.
func newBroker(t testing.TB, url string, opts Options) *Broker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := New(ctx, url, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func serverURL(t testing.TB) string {
	t.Helper()
	return integration.RabbitMQURL(t)
}
