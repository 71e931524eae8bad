package jetstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestExtendLeaseAnsweredAfterLeaseEnd: a heartbeat's ExtendLease sent
// shortly before the lease ends, on a connection that stalls (frozen) until
// the server has redelivered the message to another consumer. The +WPI then
// reaches the server late (it restarts the AckWait of the other holder's
// delivery) and is answered; ExtendLease returned nil and moved berth's
// lease to a full AckWait from its send, so the first holder's Ack was
// accepted and removed the message under the second holder. As with the
// lease timer's renewals, an answer that comes after the lease's end
// renews nothing: ExtendLease reports ErrLeaseLost, and so does the Ack.
func TestExtendLeaseAnsweredAfterLeaseEnd(t *testing.T) {
	const ackWait = 2 * time.Second
	opts := jetstream.Options{AckWait: ackWait, WaitTime: 300 * time.Millisecond, MaxDeliveries: testMaxDeliveries, Logger: quiet}
	ctx, p, direct, _, q, first := proxiedDelivery(t, opts, "leaselate")
	t0 := time.Now()
	time.Sleep(ackWait * 3 / 4) // late in the lease, as a heartbeat may be

	second, err := stalledCall(ctx, t, p, direct, q, t0, ackWait, func() error { return first.ExtendLease(ctx, ackWait) })
	t.Logf("redelivered after %v, attempt %d", time.Since(t0), second.Attempt())
	t.Logf("ExtendLease answered after %v: %v", time.Since(t0), err)
	ackErr := first.Ack(ctx)
	if !errors.Is(ackErr, sdk.ErrLeaseLost) {
		t.Errorf("first holder's Ack while another consumer holds the message = %v; want ErrLeaseLost (ExtendLease returned %v)", ackErr, err)
	}
	if err == nil {
		t.Errorf("ExtendLease answered only after the server redelivered the message: nil, want ErrLeaseLost")
	}
	if err := second.Ack(ctx); err != nil {
		t.Errorf("second holder's Ack: %v", err)
	}
}

// TestSettlementAnsweredAfterLeaseEnd: a settlement sent shortly before the
// lease ends, on a connection that stalls until the server has redelivered
// the message to another consumer. JetStream applies the late +ACK or -NAK
// to the other holder's delivery (removing the message under it, or
// delivering it a third time) and answers it as any other; Release and
// DeadLetter, whose copy is stored late, acked the original likewise. Each
// returned nil, as if this delivery had been settled while it held the
// message. An answer that does not come within the lease is ErrLeaseLost,
// as ExtendLease's, and a copy stored after the lease's end is not
// followed by an ack of the original.
func TestSettlementAnsweredAfterLeaseEnd(t *testing.T) {
	settle := map[string]func(context.Context, sdk.Delivery) error{
		"Ack":        func(ctx context.Context, d sdk.Delivery) error { return d.Ack(ctx) },
		"Retry":      func(ctx context.Context, d sdk.Delivery) error { return d.Retry(ctx, 0, errors.New("again")) },
		"DeadLetter": func(ctx context.Context, d sdk.Delivery) error { return d.DeadLetter(ctx, errors.New("bad")) },
		"Release":    func(ctx context.Context, d sdk.Delivery) error { return d.(sdk.Releaser).Release(ctx, 0) },
	}
	for _, name := range []string{"Ack", "Retry", "DeadLetter", "Release"} {
		t.Run(name, func(t *testing.T) {
			const ackWait = 2 * time.Second
			opts := jetstream.Options{AckWait: ackWait, WaitTime: 300 * time.Millisecond, MaxDeliveries: testMaxDeliveries, Logger: quiet}
			ctx, p, direct, _, q, first := proxiedDelivery(t, opts, "settlelate")
			t0 := time.Now()
			time.Sleep(ackWait * 3 / 4) // late in the lease

			second, err := stalledCall(ctx, t, p, direct, q, t0, ackWait, func() error { return settle[name](ctx, first) })
			if !errors.Is(err, sdk.ErrLeaseLost) {
				t.Errorf("%s answered only after the message was redelivered (attempt %d) = %v; want ErrLeaseLost", name, second.Attempt(), err)
			}
			if err := second.Ack(ctx); err != nil {
				t.Errorf("second holder's Ack: %v", err)
			}
		})
	}
}

// stalledCall freezes the first holder's connection (p), runs call on it,
// and receives on direct until the server redelivers the message (within
// three AckWaits of t0), then thaws the connection. It returns the second
// delivery and call's error, answered once the connection thawed.
func stalledCall(ctx context.Context, t *testing.T, p *integration.Proxy, direct *jetstream.Broker, q string, t0 time.Time, ackWait time.Duration, call func() error) (sdk.Delivery, error) {
	t.Helper()
	p.Freeze()
	answered := make(chan error, 1)
	go func() { answered <- call() }()
	var second sdk.Delivery
	for second == nil && time.Since(t0) < 3*ackWait {
		got, err := direct.Receive(ctx, q, 1)
		if err != nil {
			p.Thaw()
			t.Fatal(err)
		}
		if len(got) > 0 {
			second = got[0]
		}
	}
	p.Thaw()
	if second == nil {
		t.Fatal("not redelivered while the first holder's connection stalled")
	}
	return second, <-answered
}
