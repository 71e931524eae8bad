package jetstream_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// TestLeaseTimerRenewalNotConfirmed: ExtendLease for longer than AckWait
// keeps the lease by repeating +WPI from a timer. While the connection is
// down those renewals cannot reach the server, which redelivers the message
// once AckWait has passed; berth must then not count the lease as held: the
// first holder's Ack, made after reconnecting while another consumer holds
// the message, reports ErrLeaseLost and does not remove the message under
// the second holder.
func TestLeaseTimerRenewalNotConfirmed(t *testing.T) {
	const ackWait = 2 * time.Second
	opts := jetstream.Options{AckWait: ackWait, WaitTime: 300 * time.Millisecond, MaxDeliveries: testMaxDeliveries, Logger: quiet}
	ctx, p, direct, b, q, first := proxiedDelivery(t, opts, "leasetimer")
	t0 := time.Now()
	// A long lease: kept by the timer, every AckWait/2.
	if err := first.ExtendLease(ctx, 10*ackWait); err != nil {
		t.Fatal(err)
	}

	// The connection goes down for longer than AckWait.
	p.Refuse(true)
	p.Reset()
	for b.ConnectionError() == nil && time.Since(t0) < time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	if b.ConnectionError() == nil {
		t.Fatal("the connection did not notice the reset")
	}

	// The server, which got no +WPI since t0, redelivers after AckWait.
	var second sdk.Delivery
	for second == nil && time.Since(t0) < 2*ackWait {
		got, err := direct.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 {
			second = got[0]
		}
	}
	if second == nil {
		t.Fatal("not redelivered while the first holder was cut off")
	}
	t.Logf("redelivered after %v, attempt %d", time.Since(t0), second.Attempt())

	p.Refuse(false)
	for b.ConnectionError() != nil && time.Since(t0) < 4*ackWait {
		time.Sleep(5 * time.Millisecond)
	}
	if err := b.ConnectionError(); err != nil {
		t.Fatalf("not reconnected: %v", err)
	}
	time.Sleep(100 * time.Millisecond) // let nats.go flush what it buffered

	err := first.Ack(ctx)
	t.Logf("first holder's Ack after %v: %v", time.Since(t0), err)
	if !errors.Is(err, sdk.ErrLeaseLost) {
		t.Errorf("first holder's Ack while another consumer holds the message = %v; want ErrLeaseLost", err)
	}
	if err := second.Ack(ctx); err != nil {
		t.Errorf("second holder's Ack: %v", err)
	}
}

// TestLeaseTimerRenewalAfterRetry: ExtendLease's timer sent its +WPI
// without holding the delivery, so a Retry(d) made meanwhile could reach
// the server first; the +WPI, applied to the nak'ed message, restarted its
// AckWait, and the message came back after AckWait instead of after d
// (Retry promises "not before d").
func TestLeaseTimerRenewalAfterRetry(t *testing.T) {
	const ackWait = 2 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b := newBroker(t, jetstream.Options{AckWait: ackWait, WaitTime: 700 * time.Millisecond, MaxDeliveries: testMaxDeliveries, Logger: quiet})
	q := declare(t, b, "renewretry")
	if err := b.Publish(ctx, q, &sdk.Message{ID: "renew-retry", Type: "x"}); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(ctx, t, b, q)

	renewing, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer jetstream.SetRenewHook(func() {
		once.Do(func() {
			close(renewing)
			select { // the Retry below goes first, unless the renewal holds it back
			case <-proceed:
			case <-time.After(300 * time.Millisecond):
			}
		})
	})()
	if err := d.ExtendLease(ctx, 10*ackWait); err != nil { // renewed by the timer every AckWait/2
		t.Fatal(err)
	}
	select {
	case <-renewing:
	case <-ctx.Done():
		t.Fatal("the lease timer did not renew")
	}
	err := d.Retry(ctx, time.Minute, errors.New("later"))
	close(proceed)
	if err != nil {
		t.Fatalf("Retry: %v", err)
	}
	// Retried with a minute's delay: not back within a few AckWaits.
	for until := time.Now().Add(3 * ackWait); time.Now().Before(until); {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, got := range ds {
			t.Fatalf("%s (attempt %d) redelivered a minute early: a +WPI sent after the Retry's nak restarted its AckWait",
				got.Message().ID, got.Attempt())
		}
	}
}
