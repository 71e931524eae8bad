package ledger_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// TestLostLeaseThenBrokerDeadLetter: on the memory broker with a 50ms
// lease and a delivery cap of 1, a handler that hangs loses its lease (the
// Worker's heartbeat comes too late) and the broker dead-letters the
// message itself. The ledger shows the lost lease as the attempt's end
// (retrying, class lease_lost); a janitor run syncing the dead-letter queue
// then shows it dead with the broker's reason, and a later run purges it.
func TestLostLeaseThenBrokerDeadLetter(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	b, err := memory.New(memory.Options{Lease: 50 * time.Millisecond, MaxDeliveries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	store := newStore(t, newPool(t))
	led := newLedger(t, store, ledger.Options{Linger: -1})
	e := env{name: "memory", b: b, queue: "ledger_" + suffix(), led: led, reader: store}
	m := &sdk.Message{Type: "ledger.hang", Body: []byte(`{}`)}
	if err := e.publisher().Publish(ctx, e.queue, m); err != nil {
		t.Fatal(err)
	}
	var cause atomic.Value
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		<-ctx.Done()
		cause.Store(context.Cause(ctx))
		return ctx.Err()
	})
	// The Worker believes in a longer lease than the broker grants: its
	// first heartbeat finds the lease gone.
	w := startWorker(t, e, h, sdk.WorkerOptions{Concurrency: 2, Lease: 600 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond})
	j := waitJob(t, ctx, store, m.ID, "retrying after a lost lease", func(j *ledger.Job) bool {
		return j.Status == ledger.StatusRetrying
	})
	w.stop(t)
	if c, _ := cause.Load().(error); !errors.Is(c, sdk.ErrLeaseLost) {
		t.Fatalf("handler's context ended with %v, want ErrLeaseLost", c)
	}
	if j.Attempts != 1 || j.ErrorClass != ledger.ClassLeaseLost || !strings.HasPrefix(j.LastError, sdk.ErrLeaseLost.Error()) ||
		!j.NextAttemptAt.IsZero() {
		t.Fatalf("after the lost lease: %+v; want attempt 1, class lease_lost, the lease error, no next attempt time", j)
	}

	jctx, stop := context.WithCancel(ctx)
	runs := make(chan ledger.JanitorRun, 16)
	done := make(chan error, 1)
	go func() {
		done <- ledger.RunJanitor(jctx, ledger.JanitorOptions{
			Purger: store, Retention: time.Hour, Interval: 20 * time.Millisecond,
			Ledger: led, DeadLetters: b, DeadLetterQueues: []string{e.queue},
			Report: func(r ledger.JanitorRun) {
				select {
				case runs <- r:
				default:
				}
			},
		})
	}()
	r := <-runs
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunJanitor = %v, want context.Canceled", err)
	}
	if r.Err != nil || r.Synced != 1 || r.Purged != 0 {
		t.Fatalf("janitor run %+v: want 1 dead letter synced, nothing purged (retention 1h)", r)
	}
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	j, err = store.Job(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != ledger.StatusDead || j.ErrorClass != sdk.ClassPoison || j.LastError != sdk.ErrMaxDeliveries.Error() || j.Attempts != 1 {
		t.Fatalf("after the sync: %+v; want dead at attempt 1 with the broker's max-deliveries reason", j)
	}

	// A second sync changes nothing; a janitor with a short retention
	// purges the dead job.
	if n, err := led.SyncDeadLetters(ctx, b, e.queue, 0); err != nil || n != 1 {
		t.Fatalf("SyncDeadLetters = %d, %v", n, err)
	}
	// Written before the purge: landing between two of its batches, the
	// sync's event made the row again, and the purge counted it twice.
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	jctx, stop = context.WithCancel(ctx)
	go func() {
		done <- ledger.RunJanitor(jctx, ledger.JanitorOptions{Purger: store, Retention: time.Millisecond, Batch: 1,
			Report: func(r ledger.JanitorRun) { runs <- r }})
	}()
	r = <-runs
	stop()
	<-done
	if r.Err != nil || r.Purged != 1 {
		t.Fatalf("purging run %+v, want 1 purged", r)
	}
	if _, err := store.Job(ctx, m.ID); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Job after purge: %v, want ErrNotFound", err)
	}
}

func TestRunJanitorValidates(t *testing.T) {
	for _, o := range []ledger.JanitorOptions{
		{},
		{DeadLetterQueues: []string{"q"}},
		{Purger: nopPurger{}, Retention: -1},
	} {
		if err := ledger.RunJanitor(context.Background(), o); !errors.Is(err, ledger.ErrInvalidJanitor) {
			t.Errorf("RunJanitor(%+v) = %v, want ErrInvalidJanitor", o, err)
		}
	}
}

type nopPurger struct{}

func (nopPurger) Purge(context.Context, time.Time, int) (int, error) { return 0, nil }

// failAck is a subscriber whose deliveries' first ack fails without
// reaching the broker: what a connection lost at the wrong moment does, on
// demand.
type failAck struct {
	sdk.Subscriber
	failed atomic.Bool
}

func (f *failAck) Receive(ctx context.Context, queue string, n int) ([]sdk.Delivery, error) {
	ds, err := f.Subscriber.Receive(ctx, queue, n)
	for i, d := range ds {
		ds[i] = &failAckDelivery{Delivery: d, f: f}
	}
	return ds, err
}

type failAckDelivery struct {
	sdk.Delivery
	f *failAck
}

var errConnReset = errors.New("connection reset by peer")

func (d *failAckDelivery) Ack(ctx context.Context) error {
	if d.f.failed.CompareAndSwap(false, true) {
		return errConnReset
	}
	return d.Delivery.Ack(ctx)
}

// TestFailedSettlementIsRecorded: an ack that fails leaves the message
// with the broker, which delivers it again after the lease; the ledger
// shows attempt 1 as retrying with the failed ack (class settle_failed) in
// the history and attempt 2 succeeded.
func TestFailedSettlementIsRecorded(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	// A lease of a second: attempt 2 must be acked within it, and at 100 ms a
	// stall between its receive and its ack cost the lease, and attempt 3 ran.
	b, err := memory.New(memory.Options{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	store := newStore(t, newPool(t))
	led := newLedger(t, store, ledger.Options{Linger: -1})
	q := "ledger_" + suffix()
	m := &sdk.Message{Type: "ledger.ackfail", Body: []byte(`{}`)}
	if err := led.Publisher(b).Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	sub := &failAck{Subscriber: b}
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: q, Observers: []sdk.Observer{led}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	j := waitJob(t, ctx, store, m.ID, "succeeded at attempt 2", func(j *ledger.Job) bool {
		return j.Status == ledger.StatusSucceeded && j.Attempts == 2
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var first *ledger.Attempt
	for i := range j.History {
		if j.History[i].Attempt == 1 {
			first = &j.History[i]
		}
	}
	if first == nil || first.Status != ledger.StatusRetrying || first.Class != ledger.ClassSettleFailed ||
		!strings.Contains(first.Error, "ack failed: "+errConnReset.Error()) {
		t.Fatalf("history %+v: want attempt 1 retrying, class settle_failed, the ack's error", j.History)
	}
}

// TestBrokerDeadLetterRabbitMQ: a job whose consumers die twice is
// dead-lettered by RabbitMQ itself (the quorum queue's delivery limit), out
// of any Worker's sight; SyncDeadLetters records it dead with the broker's
// reason over the second crashed attempt's running row. RabbitMQ does not
// say at which attempt it dead-lettered (no x-delivery-count on the dead
// letter), so the sync ends whatever attempt the row is at.
func TestBrokerDeadLetterRabbitMQ(t *testing.T) {
	url := integration.RabbitMQURL(t)
	ctx := testCtx(t, 60*time.Second)
	opts := rabbitmq.Options{Logger: quiet, MaxDeliveries: 2}
	open := func() *rabbitmq.Broker {
		b, err := rabbitmq.New(ctx, url, opts)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	b := open()
	q := "berth_ledgertest_" + suffix()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = b.DeleteQueue(ctx, q)
		_ = b.Close()
	})
	store := newStore(t, newPool(t))
	led := newLedger(t, store, ledger.Options{Linger: -1})
	m := &sdk.Message{Type: "ledger.poison", Body: []byte(`{}`)}
	if err := led.Publisher(b).Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	// Each consumer starts the job (as its Worker's Observer would) and
	// dies: its connection closes with the delivery unsettled.
	for attempt := 1; attempt <= 2; attempt++ {
		c := open()
		var ds []sdk.Delivery
		for len(ds) == 0 {
			var err error
			if ds, err = c.Receive(ctx, q, 1); err != nil {
				t.Fatal(err)
			}
		}
		if ds[0].Message().ID != m.ID || ds[0].Attempt() != attempt {
			t.Fatalf("received %s attempt %d, want %s attempt %d", ds[0].Message().ID, ds[0].Attempt(), m.ID, attempt)
		}
		led.Start(ctx, ds[0])
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if j, err := store.Job(ctx, m.ID); err != nil || j.Status != ledger.StatusRunning || j.Attempts != 2 {
		t.Fatalf("before the sync: %+v, %v; want running at attempt 2", j, err)
	}
	for {
		dead, err := b.ListDeadLetters(ctx, q, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(dead) == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d dead letters, want the poison message", len(dead))
		case <-time.After(50 * time.Millisecond):
		}
	}
	if n, err := led.SyncDeadLetters(ctx, b, q, 0); err != nil || n != 1 {
		t.Fatalf("SyncDeadLetters = %d, %v", n, err)
	}
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	j, err := store.Job(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != ledger.StatusDead || j.ErrorClass != sdk.ClassPoison || j.LastError != sdk.ErrMaxDeliveries.Error() || j.Attempts < 2 {
		t.Fatalf("after the sync: %+v; want dead, max_deliveries, at attempt 2 or later", j)
	}
}
