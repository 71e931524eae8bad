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

// TestCallsReturnByCtxWhileReconnectHangs: with the server behind a black
// hole (new connections accepted, never answered), nats.go's reconnect
// holds the connection's lock through its handshake, for the connection's
// Timeout (here 2 min). Publish and Receive checked the connection's status
// with nc.Status, which waits for that lock: a call with a 1 s ctx hung for
// the whole handshake. They read the status the Broker keeps from the
// connection's status events (as ConnectionError does) and return at once,
// with an error wrapping sdk.ErrUnavailable.
func TestCallsReturnByCtxWhileReconnectHangs(t *testing.T) {
	opts := jetstream.Options{WaitTime: 500 * time.Millisecond, Logger: quiet}
	direct := newBroker(t, opts)
	q := declare(t, direct, "reconnectlock")
	u, p := integration.ProxyURL(t, integration.NATSURL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b, err := jetstream.Connect(ctx, u.String(), jetstream.ConnectOptions{
		Name:          "berth-test-reconnectlock",
		ReconnectWait: 50 * time.Millisecond,
		Extra:         []nats.Option{nats.Timeout(2 * time.Minute)},
	}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	// Declared through b, so that the calls below need no request first.
	if err := b.Publish(ctx, q, &sdk.Message{Type: "x"}); err != nil {
		t.Fatal(err)
	}

	p.Freeze()
	p.Reset()
	waitConn(ctx, t, b, false)
	time.Sleep(300 * time.Millisecond) // the reconnect's handshake is under way, holding the lock

	calls := []struct {
		name string
		call func(context.Context) error
	}{
		{"Publish", func(ctx context.Context) error { return b.Publish(ctx, q, &sdk.Message{Type: "x"}) }},
		{"PublishAsync", func(ctx context.Context) error { _, err := b.PublishAsync(ctx, q, &sdk.Message{Type: "x"}); return err }},
		{"Receive", func(ctx context.Context) error { _, err := b.Receive(ctx, q, 1); return err }},
	}
	type result struct {
		err  error
		took time.Duration
	}
	results := make([]chan result, len(calls))
	for i, c := range calls {
		results[i] = make(chan result, 1)
		go func() {
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			defer ccancel()
			start := time.Now()
			err := c.call(cctx)
			results[i] <- result{err, time.Since(start)}
		}()
	}
	pending := make([]bool, len(calls))
	for i, c := range calls {
		select {
		case r := <-results[i]:
			if !errors.Is(r.err, sdk.ErrUnavailable) && !errors.Is(r.err, context.DeadlineExceeded) {
				t.Errorf("%s while the reconnect hangs = %v after %v; want ErrUnavailable (or its ctx's deadline)", c.name, r.err, r.took)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s with a 1 s ctx still running 5 s into a hung reconnect (waiting for the connection's lock)", c.name)
			pending[i] = true
		}
	}
	p.Thaw() // the handshake completes: every call returns
	for i := range calls {
		if pending[i] {
			<-results[i]
		}
	}
}
