package jetstream_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestExtendLeaseWhileReconnecting: a lease renewal made while nats.go
// reconnects, or while the connection is silently dead, fails with an
// error that is not ErrLeaseLost (so the Worker tries again rather than
// giving the job up) within its context; once reconnected, a renewal
// reaches the server and holds the message past its first AckWait.
func TestExtendLeaseWhileReconnecting(t *testing.T) {
	const ackWait = 3 * time.Second
	opts := jetstream.Options{AckWait: ackWait, WaitTime: 700 * time.Millisecond, MaxDeliveries: testMaxDeliveries, Logger: quiet}
	ctx, p, _, b, q, d := proxiedDelivery(t, opts, "leasereconnect")
	t0 := time.Now()

	// Reconnecting.
	p.Refuse(true)
	p.Reset()
	for b.ConnectionError() == nil && time.Since(t0) < 2*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	if b.ConnectionError() == nil {
		t.Fatal("the connection did not notice the reset")
	}
	ectx, ecancel := context.WithTimeout(ctx, 500*time.Millisecond)
	start := time.Now()
	err := d.ExtendLease(ectx, ackWait)
	ecancel()
	took := time.Since(start)
	t.Logf("ExtendLease while reconnecting: %v after %v", err, took)
	if err == nil || errors.Is(err, sdk.ErrLeaseLost) || !errors.Is(err, sdk.ErrUnavailable) || took > 2*time.Second {
		t.Errorf("ExtendLease while reconnecting = %v after %v; want ErrUnavailable (not ErrLeaseLost) within its context", err, took)
	}
	p.Refuse(false)
	for b.ConnectionError() != nil && time.Since(t0) < 2*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	if err := b.ConnectionError(); err != nil {
		t.Fatalf("not reconnected: %v", err)
	}

	// Silently dead (half-open): bounded by the context.
	p.Freeze()
	ectx, ecancel = context.WithTimeout(ctx, 300*time.Millisecond)
	start = time.Now()
	err = d.ExtendLease(ectx, ackWait)
	ecancel()
	took = time.Since(start)
	p.Thaw()
	t.Logf("ExtendLease on a frozen connection: %v after %v", err, took)
	if errors.Is(err, sdk.ErrLeaseLost) || took > 2*time.Second {
		t.Errorf("ExtendLease on a frozen connection = %v after %v; want an error other than ErrLeaseLost within its context", err, took)
	}

	// Reconnected: the renewal reaches the server. Made a second after the
	// delivery, it holds the message a second past the first AckWait.
	time.Sleep(time.Until(t0.Add(time.Second)))
	if err := d.ExtendLease(ctx, ackWait); err != nil {
		t.Fatalf("ExtendLease after reconnecting: %v", err)
	}
	popts := opts
	popts.WaitTime = 200 * time.Millisecond // every poll over before the renewed lease ends
	poller := newBroker(t, popts)
	// Past the first AckWait, and ending well before the renewed lease does
	// (t0 + 4 s), so that the Ack below is within it under load too.
	for time.Since(t0) < ackWait+250*time.Millisecond {
		got, err := poller.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 {
			t.Fatalf("redelivered %v after %v: the renewal did not reach the server", got[0].Message().ID, time.Since(t0))
		}
	}
	if err := d.Ack(ctx); err != nil {
		t.Errorf("Ack after the first AckWait, within the renewed lease: %v", err)
	}
}

// proxiedDelivery is the set-up of the lease tests: a broker b connected
// through a fault proxy p, a broker direct that bypasses it, and one
// message published on a new queue q (named after name) and received
// through b as d. ctx ends with the test, after 30 s at most.
func proxiedDelivery(t *testing.T, opts jetstream.Options, name string) (ctx context.Context, p *integration.Proxy, direct, b *jetstream.Broker, q string, d sdk.Delivery) {
	t.Helper()
	direct = newBroker(t, opts)
	q = declare(t, direct, name)
	var u *url.URL
	u, p = integration.ProxyURL(t, integration.NATSURL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	b, err := jetstream.Connect(ctx, u.String(), jetstream.ConnectOptions{Name: "berth-test-" + name, ReconnectWait: 50 * time.Millisecond}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := direct.Publish(ctx, q, &sdk.Message{Type: "long"}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	return ctx, p, direct, b, q, ds[0]
}
