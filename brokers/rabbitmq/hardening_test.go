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
	url := serverURL(t)
	q := testQueue(t, url)
	b := newBroker(t, url, Options{Logger: quiet})
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
	// Start the consumer so that the deliveries wait in this process.
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]sdk.Delivery{ds[0].Message().ID: ds[0]}
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
	url := serverURL(t)
	q := testQueue(t, url)
	b := newBroker(t, url, Options{NoDeclare: true, Logger: quiet})
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
