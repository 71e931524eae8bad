package jetstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestCopyPublishWhileReconnectingIsUnavailable: while nats.go reconnects,
// a publish beyond its reconnect buffer (here disabled,
// nats.ReconnectBufSize(-1), so every one is beyond it) is refused with
// nats.ErrReconnectBufExceeded. berth must report that as it reports every
// other connection failure, an error wrapping sdk.ErrUnavailable (publish
// again once reconnected). DeadLetter and Release publish their copies
// without checking the connection first, and returned it unclassified: a
// caller deciding with errors.Is(err, sdk.ErrUnavailable) took it for
// permanent.
func TestCopyPublishWhileReconnectingIsUnavailable(t *testing.T) {
	opts := jetstream.Options{MaxDeliveries: testMaxDeliveries, Logger: quiet}
	direct := newBroker(t, opts)
	q := declare(t, direct, "reconnectbuf")
	u, p := integration.ProxyURL(t, integration.NATSURL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b, err := jetstream.Connect(ctx, u.String(), jetstream.ConnectOptions{
		Name:          "berth-test-reconnectbuf",
		ReconnectWait: 50 * time.Millisecond,
		Extra:         []nats.Option{nats.ReconnectBufSize(-1)},
	}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := direct.Publish(ctx, q, &sdk.Message{Type: "reconnectbuf"}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	d := ds[0]

	// Reconnecting, and staying so.
	p.Refuse(true)
	p.Reset()
	waitConn(ctx, t, b, false)
	calls := []struct {
		name string
		call func() error
	}{
		{"DeadLetter", func() error { return d.DeadLetter(ctx, errors.New("poison")) }},
		{"Release", func() error { return d.(sdk.Releaser).Release(ctx, 0) }},
		{"Publish", func() error { return b.Publish(ctx, q, &sdk.Message{Type: "reconnectbuf"}) }},
		{"PublishAsync", func() error { _, err := b.PublishAsync(ctx, q, &sdk.Message{Type: "reconnectbuf"}); return err }},
	}
	for _, s := range calls {
		if err := s.call(); !errors.Is(err, sdk.ErrUnavailable) {
			t.Errorf("%s while reconnecting, beyond the reconnect buffer: %v; want an error wrapping sdk.ErrUnavailable", s.name, err)
		}
	}

	// Reconnected, the same call goes through.
	p.Refuse(false)
	waitConn(ctx, t, b, true)
	if err := d.DeadLetter(ctx, errors.New("poison")); err != nil {
		t.Fatalf("DeadLetter once reconnected: %v", err)
	}
}

// waitConn waits until b's connection is up (up) or down (!up).
func waitConn(ctx context.Context, t *testing.T, b *jetstream.Broker, up bool) {
	t.Helper()
	for (b.ConnectionError() == nil) != up {
		select {
		case <-ctx.Done():
			t.Fatalf("connection up = %v still after the test's deadline: %v", !up, b.ConnectionError())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
