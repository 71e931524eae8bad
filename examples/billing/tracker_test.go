package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// fullSub is a Subscriber with every optional interface a Worker looks for
// on its Subscriber; it records the calls that reach it.
type fullSub struct {
	stopped chan string
	flushed chan struct{}
	connErr error
}

func (s *fullSub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (s *fullSub) Lease() time.Duration       { return 42 * time.Second }
func (s *fullSub) MaxDeliveries() int         { return 3 }
func (s *fullSub) ReceiveBatch() int          { return 10 }
func (s *fullSub) ReceiveWait() time.Duration { return 20 * time.Second }
func (s *fullSub) ConnectionError() error     { return s.connErr }
func (s *fullSub) Flush(ctx context.Context) error {
	s.flushed <- struct{}{}
	return nil
}
func (s *fullSub) StopReceiving(ctx context.Context, queue string) error {
	s.stopped <- queue
	return nil
}

// plainSub has Receive only.
type plainSub struct{}

func (plainSub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// The tracker sits between the broker and the Workers: it must not hide the
// broker's optional interfaces, which change what a Worker does. It hid
// them all: Pause left RabbitMQ's prefetched messages held (ReceiveStopper),
// the Worker took no delivery cap or lease from the broker, never flushed
// SQS's buffered deletes at drain and cut SQS's long polls at shutdown.
func TestTrackerForwardsOptionalInterfaces(t *testing.T) {
	full := &fullSub{stopped: make(chan string, 1), flushed: make(chan struct{}, 1), connErr: errors.New("down")}
	sub := newTracker(full, false, 1, 1).subscriber()
	if lr, ok := sub.(sdk.LeaseReporter); !ok || lr.Lease() != 42*time.Second {
		t.Errorf("LeaseReporter hidden or wrong (%v)", ok)
	}
	if cr, ok := sub.(sdk.DeliveryCapReporter); !ok || cr.MaxDeliveries() != 3 {
		t.Errorf("DeliveryCapReporter hidden or wrong (%v)", ok)
	}
	if rb, ok := sub.(sdk.ReceiveBatcher); !ok || rb.ReceiveBatch() != 10 {
		t.Errorf("ReceiveBatcher hidden or wrong (%v)", ok)
	}
	if lp, ok := sub.(sdk.LongPoller); !ok || lp.ReceiveWait() != 20*time.Second {
		t.Errorf("LongPoller hidden or wrong (%v)", ok)
	}
	if cr, ok := sub.(sdk.ConnectionReporter); !ok || cr.ConnectionError() != full.connErr {
		t.Errorf("ConnectionReporter hidden or wrong (%v)", ok)
	}
	if f, ok := sub.(sdk.Flusher); !ok || f.Flush(t.Context()) != nil || len(full.flushed) != 1 {
		t.Errorf("Flusher hidden or not forwarded (%v)", ok)
	}

	// Through a Worker: the broker's cap is seen (Retry.MaxAttempts 5 over
	// a cap of 3 is refused with StrictConfig), and Pause asks the broker
	// to hand back what it took in ahead of Receive.
	_, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "q", Retry: sdk.RetryPolicy{MaxAttempts: 5}, StrictConfig: true})
	if !errors.Is(err, sdk.ErrConfigConflict) {
		t.Errorf("NewWorker over a cap of 3 with MaxAttempts 5 = %v, want ErrConfigConflict", err)
	}
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Pause("q"); err != nil {
		t.Fatal(err)
	}
	select {
	case q := <-full.stopped:
		if q != "q" {
			t.Errorf("StopReceiving(%q), want q", q)
		}
	case <-time.After(10 * time.Second):
		t.Error("Pause did not reach the broker's StopReceiving")
	}

	// A broker without them: the tracker answers as "not supported", and
	// adds no LongPoller (its presence alone changes the Worker).
	plain := newTracker(plainSub{}, false, 1, 1).subscriber()
	if _, ok := plain.(sdk.LongPoller); ok {
		t.Error("LongPoller added over a broker without one")
	}
	if lr, ok := plain.(sdk.LeaseReporter); ok && lr.Lease() != 0 {
		t.Errorf("lease %s over a broker without one", lr.Lease())
	}
	if cr, ok := plain.(sdk.DeliveryCapReporter); ok && cr.MaxDeliveries() != 0 {
		t.Errorf("cap %d over a broker without one", cr.MaxDeliveries())
	}
}

// asyncDelivery is a delivery whose Ack can finish in the background.
type asyncDelivery struct {
	sdk.Delivery
	msg *sdk.Message
}

func (d *asyncDelivery) Message() *sdk.Message { return d.msg }
func (d *asyncDelivery) Attempt() int          { return 1 }
func (d *asyncDelivery) AckAsync(ctx context.Context, done func(error)) {
	go done(nil)
}
func (d *asyncDelivery) Release(ctx context.Context, delay time.Duration) error { return nil }

// A tracked delivery keeps the broker's AckAsync (PostgreSQL: acks written
// together) and Release, and an async ack counts as done.
func TestTrackedDeliveryKeepsAsyncAck(t *testing.T) {
	tr := newTracker(plainSub{}, false, 1, 1)
	d := tr.wrap(&asyncDelivery{msg: &sdk.Message{ID: "m1"}})
	if _, ok := d.(sdk.Releaser); !ok {
		t.Error("Releaser hidden")
	}
	aa, ok := d.(sdk.AsyncAcker)
	if !ok {
		t.Fatal("AsyncAcker hidden")
	}
	acked := make(chan error, 1)
	aa.AckAsync(t.Context(), func(err error) { acked <- err })
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
	select {
	case <-tr.allDone:
	case <-time.After(10 * time.Second):
		t.Fatal("an async ack was not counted as done")
	}
	if tr.acked.Load() != 1 {
		t.Errorf("acked = %d, want 1", tr.acked.Load())
	}
}
