package jetstream_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berthq/berth/brokers/jetstream"
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

// suffix returns 12 random hex characters.
func suffix() string {
	var p [6]byte
	_, _ = rand.Read(p[:])
	return hex.EncodeToString(p[:])
}

// newBroker connects a broker to the test server, closed with the test.
func newBroker(t testing.TB, opts jetstream.Options) *jetstream.Broker {
	t.Helper()
	url := integration.NATSURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := jetstream.Connect(ctx, url, jetstream.ConnectOptions{Name: "berth-test"}, opts)
	if err != nil {
		t.Fatalf("jetstream.Connect: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// declare declares a unique queue (prefix + random) through b and deletes
// its streams when the test ends, through a broker of its own (b may be
// closed by then).
func declare(t testing.TB, b *jetstream.Broker, prefix string) string {
	t.Helper()
	q := prefix + "_" + suffix()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatalf("DeclareQueue(%q): %v", q, err)
	}
	url := integration.NATSURL(t)
	opts := b.Options()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := jetstream.Connect(ctx, url, jetstream.ConnectOptions{Name: "berth-test-cleanup"}, jetstream.Options{Prefix: opts.Prefix})
		if err != nil {
			t.Errorf("cleanup connect: %v", err)
			return
		}
		defer c.Close()
		if err := c.DeleteQueue(ctx, q); err != nil {
			t.Errorf("DeleteQueue(%q): %v", q, err)
		}
	})
	return q
}
