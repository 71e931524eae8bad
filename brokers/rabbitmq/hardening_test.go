package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// TestContract18_2_ReceiveCancelledCtx: Receive with a context that is
// already done returns ctx.Err() and takes nothing, even when deliveries
// wait. Before, select picked between the delivery and ctx.Done() at random:
// 5 of 30 calls returned a delivery the caller believed it never got.
func TestContract18_2_ReceiveCancelledCtx(t *testing.T) {
	_, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var ids []string
	for range 5 {
		m := &sdk.Message{Type: "cancelled"}
		if err := b.Publish(ctx, q, m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}
	// Start the consumer (prefetch 5, this call's max) so that the
	// deliveries wait in this process.
	ds, err := b.Receive(ctx, q, 5)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]sdk.Delivery{}
	for _, d := range ds {
		got[d.Message().ID] = d
	}
	time.Sleep(200 * time.Millisecond) // let the rest arrive
	done, stop := context.WithCancel(ctx)
	stop()
	for i := range 30 {
		ds, err := b.Receive(done, q, 5)
		if !errors.Is(err, context.Canceled) || len(ds) != 0 {
			t.Fatalf("call %d with a cancelled ctx: %d deliveries, err %v; want none and context.Canceled", i, len(ds), err)
		}
	}
	for len(got) < len(ids) {
		ds, err := b.Receive(ctx, q, 5)
		if err != nil {
			t.Fatalf("after the cancelled calls: %v (have %d of %d)", err, len(got), len(ids))
		}
		for _, d := range ds {
			got[d.Message().ID] = d
		}
	}
	for _, id := range ids {
		d := got[id]
		if d == nil {
			t.Fatalf("message %s not received", id)
		}
		if d.Attempt() != 1 {
			t.Errorf("message %s: attempt %d, want 1", id, d.Attempt())
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHardening9_TLSConfigNotMutated: the caller's *tls.Config is left as
// it was given. Before, the AMQP client wrote ServerName into it on dial,
// a data race for a config shared with other clients.
func TestHardening9_TLSConfigNotMutated(t *testing.T) {
	url := serverURL(t)
	cert, pool := selfSigned(t)
	_, amqps := newTLSProxy(t, url, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	b := newBroker(t, amqps, Options{TLS: cfg, Logger: quiet})
	q := testQueue(t, url)
	if err := b.Publish(t.Context(), q, &sdk.Message{Type: "tls"}); err != nil {
		t.Fatal(err)
	}
	if cfg.ServerName != "" {
		t.Errorf("the caller's tls.Config.ServerName was set to %q", cfg.ServerName)
	}
}

// TestHardening7_NoDeclareMissingQueue (issue 18 defect 3): with NoDeclare,
// Receive on a queue that does not exist returns an error wrapping
// sdk.ErrNotFound at once, and a Worker's Run returns it, instead of
// blocking until ctx ends while the consumer retries the 404. Once the
// queue exists, Receive works.
func TestHardening7_NoDeclareMissingQueue(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{NoDeclare: true, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := b.Receive(ctx, q, 1)
	if !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Receive on a missing queue: %v, want sdk.ErrNotFound", err)
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Errorf("Receive on a missing queue: %v, want the *amqp.Error 404 reachable", err)
	}
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: q, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(ctx); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Run on a missing queue: %v, want sdk.ErrNotFound", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run returned only when its ctx ended")
	}

	// Declared later, the queue is consumed.
	d := newBroker(t, url, Options{Logger: quiet})
	if err := d.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	m := &sdk.Message{Type: "later"}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatalf("Receive once the queue exists: %v", err)
	}
	if ds[0].Message().ID != m.ID {
		t.Fatalf("got %s, want %s", ds[0].Message().ID, m.ID)
	}
	_ = ds[0].Ack(ctx)
}

// TestHardening1_CleanShutdownKeepsAttempt: messages this process
// prefetched but no Receive returned come back after Close with their
// attempt unchanged, on quorum and classic queues, with a prefetch far above
// what was received (the run: prefetch 64, 36 of 36 unseen messages
// came back with Attempt() 2). Also: by default the prefetch is the first
// Receive's max.
func TestHardening1_CleanShutdownKeepsAttempt(t *testing.T) {
	url := serverURL(t)
	for _, qt := range []QueueType{Quorum, Classic} {
		t.Run(string(qt), func(t *testing.T) {
			q := testQueue(t, url)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			b, err := New(ctx, url, Options{QueueType: qt, Prefetch: 64, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			const n = 40
			for range n {
				if err := b.Publish(ctx, q, &sdk.Message{Type: "shutdown"}); err != nil {
					t.Fatal(err)
				}
			}
			ds, err := b.Receive(ctx, q, 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := ds[0].Ack(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // let the prefetch fill
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			r := newBroker(t, url, Options{QueueType: qt, Logger: quiet})
			for got := 0; got < n-1; {
				ds, err := r.Receive(ctx, q, n)
				if err != nil {
					t.Fatalf("after Close: %v (%d of %d back)", err, got, n-1)
				}
				for _, d := range ds {
					if d.Attempt() != 1 {
						t.Errorf("message %s: attempt %d after a clean shutdown, want 1", d.Message().ID, d.Attempt())
					}
					_ = d.Ack(ctx)
					got++
				}
			}
			xctx, xc := context.WithTimeout(ctx, time.Second)
			extra, _ := r.Receive(xctx, q, n)
			xc()
			if len(extra) > 0 {
				t.Errorf("%d deliveries beyond the %d messages left", len(extra), n-1)
			}
			if c := r.consumers[q]; c == nil || c.prefetch != n {
				t.Errorf("default prefetch: want the first Receive's max %d", n)
			}
		})
	}
}

// TestHardening2_ForgedDeadLetterHeaders: berth-* headers written by a raw
// AMQP publisher are not trusted. A message the server dead-letters itself
// (here: rejected without requeue) keeps no forged berth-dlq-queue/reason;
// redrive publishes every dead letter to the queue whose dead-letter queue
// holds it, never to a forged target, and a forged invalid target does not
// fail "redrive all". Before, redrive published into the forged queue and
// the invalid one failed the whole redrive.
func TestHardening2_ForgedDeadLetterHeaders(t *testing.T) {
	url := serverURL(t)
	q, victim := testQueue(t, url), testQueue(t, url)
	b := newBroker(t, url, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, name := range []string{q, victim} {
		if err := b.DeclareQueue(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	ch := ownChannel(t, url, true)
	forged := func(id, target string) amqp.Publishing {
		return amqp.Publishing{MessageId: id, Type: "forged", DeliveryMode: amqp.Persistent, Headers: amqp.Table{
			sdk.HeaderDeadLetterQueue:  target,
			sdk.HeaderDeadLetterReason: "forged reason",
		}}
	}
	publish := func(key string, p amqp.Publishing) {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", key, true, false, p)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("confirm: %v %v", ok, err)
		}
	}
	// One into the main queue, dead-lettered by the server on reject.
	publish(q, forged("rejected", victim))
	d, ok, err := ch.Get(q, false)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if err := d.Reject(false); err != nil {
		t.Fatal(err)
	}
	// Two straight into the dead-letter queue: a forged valid target and a
	// forged invalid one.
	publish(DeadLetterQueue(q), forged("direct", victim))
	publish(DeadLetterQueue(q), forged("invalid", "bad name!"))

	var list []*sdk.Message
	deadline := time.Now().Add(10 * time.Second)
	for len(list) < 3 && time.Now().Before(deadline) {
		if list, err = b.ListDeadLetters(ctx, q, 10); err != nil {
			t.Fatal(err)
		}
	}
	if len(list) != 3 {
		t.Fatalf("listed %d dead letters, want 3", len(list))
	}
	for _, m := range list {
		if m.ID == "rejected" {
			if got := m.Header(sdk.HeaderDeadLetterQueue); got != q {
				t.Errorf("server-made dead letter: berth-dlq-queue %q, want %q (the forged value kept)", got, q)
			}
			if got := m.Header(sdk.HeaderDeadLetterReason); got == "forged reason" {
				t.Errorf("server-made dead letter kept the forged reason")
			}
		}
	}
	n, err := b.RedriveDeadLetters(ctx, q)
	if err != nil || n != 3 {
		t.Fatalf("redrive all: %d, %v; want 3 and no error", n, err)
	}
	got := map[string]bool{}
	for len(got) < 3 {
		ds, err := b.Receive(ctx, q, 3)
		if err != nil {
			t.Fatalf("redriven messages not on %s: %v (got %v)", q, err, got)
		}
		for _, d := range ds {
			got[d.Message().ID] = true
			_ = d.Ack(ctx)
		}
	}
	info, err := b.Info(ctx, victim)
	if err != nil {
		t.Fatal(err)
	}
	if info.Ready != 0 {
		t.Errorf("the forged target %s received %d messages", victim, info.Ready)
	}
}

// TestHardening7_FrozenConnection: a frozen (half-open) connection is
// noticed within the configured heartbeat and replaced, and Close of a
// broker whose connections are frozen returns within about CloseTimeout.
// Before, Close waited for a close-ok until the heartbeat gave up (with a
// 60s heartbeat: 90s, past this test's 20s bound).
func TestHardening7_FrozenConnection(t *testing.T) {
	url := serverURL(t)
	p, purl := newProxy(t, url)
	q := testQueue(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	// Detection: with a 1s heartbeat the frozen connections are dropped
	// and a publish goes through a new one.
	b := newBroker(t, purl, Options{Heartbeat: time.Second, Logger: quiet})
	if err := b.Publish(ctx, q, &sdk.Message{Type: "before"}); err != nil {
		t.Fatal(err)
	}
	p.Freeze()
	// The publish under way when the heartbeat gives up fails with
	// ErrUnavailable (its confirm is lost); the next goes through.
	for {
		err := b.Publish(ctx, q, &sdk.Message{Type: "after"})
		if err == nil {
			break
		}
		if !errors.Is(err, sdk.ErrUnavailable) || ctx.Err() != nil {
			t.Fatalf("Publish after the freeze: %v", err)
		}
	}
	p.Thaw()

	// Close bound: a long heartbeat, everything frozen, Close returns.
	slow := newBroker(t, purl, Options{Heartbeat: 60 * time.Second, CloseTimeout: time.Second, Logger: quiet})
	if err := slow.Publish(ctx, q, &sdk.Message{Type: "slow"}); err != nil {
		t.Fatal(err)
	}
	if _, err := slow.Receive(ctx, q, 1); err != nil {
		t.Fatal(err)
	}
	p.Freeze()
	defer p.Thaw()
	closed := make(chan error, 1)
	go func() { closed <- slow.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close of a broker with frozen connections did not return within 20s (CloseTimeout 1s)")
	}
}

// TestHardening7_NewWaitsForServer: New started while the server cannot be
// reached retries within its ctx and succeeds once the server answers.
// Before, it failed at the first refused dial, so a worker started during a
// broker restart exited.
func TestHardening7_NewWaitsForServer(t *testing.T) {
	url := serverURL(t)
	p, purl := newProxy(t, url)
	p.Refuse(true)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	type result struct {
		b   *Broker
		err error
	}
	res := make(chan result, 1)
	go func() {
		b, err := New(ctx, purl, Options{Logger: quiet, Reconnect: sdk.Backoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond}})
		res <- result{b, err}
	}()
	time.Sleep(500 * time.Millisecond) // several refused dials
	select {
	case r := <-res:
		t.Fatalf("New returned while the server was unreachable: %v", r.err)
	default:
	}
	p.Refuse(false)
	r := <-res
	if r.err != nil {
		t.Fatalf("New once the server answers: %v", r.err)
	}
	_ = r.b.Close()

	// A ctx that ends first gives ErrUnavailable.
	p.Refuse(true)
	short, stop := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer stop()
	if _, err := New(short, purl, Options{Logger: quiet}); !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("New against a refusing server: %v, want sdk.ErrUnavailable", err)
	}
}

// TestContract18_5_ListingDoesNotWearDeadLetters: listing and showing a
// dead letter 50 times leaves it intact with no delivery counted on the
// quorum dead-letter queue, so no delivery limit (RabbitMQ 4's default of
// 20, or a small explicit one) can drop it, and the order of the queue is
// kept. Before, every listing returned it by closing the channel and raised
// x-delivery-count by one (50 after 50 listings).
func TestContract18_5_ListingDoesNotWearDeadLetters(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var ids []string
	for range 3 {
		m := &sdk.Message{Type: "wear"}
		if err := b.Publish(ctx, q, m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		l, err := b.ListDeadLetters(ctx, q, 2)
		if err != nil || len(l) != 2 || l[0].ID != ids[0] || l[1].ID != ids[1] {
			t.Fatalf("listing %d: %d messages, %v; want the first two in order", i, len(l), err)
		}
		if _, err := b.GetDeadLetter(ctx, q, ids[2]); err != nil {
			t.Fatalf("show %d: %v", i, err)
		}
	}
	ch := ownChannel(t, url, false)
	for _, id := range ids {
		d, ok, err := ch.Get(DeadLetterQueue(q), false)
		if err != nil || !ok {
			t.Fatalf("dead letter %s gone after 50 listings: %v %v", id, ok, err)
		}
		if d.MessageId != id {
			t.Errorf("dead letter order: got %s, want %s", d.MessageId, id)
		}
		if n, _ := toInt(d.Headers["x-delivery-count"]); n > 1 {
			t.Errorf("dead letter %s: x-delivery-count %d after 50 listings, want at most 1 (this read)", id, n)
		}
	}
}
