package sqs_test

import (
	"context"
	"errors"
	"net/http/httptrace"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// TestRetryAfterAbandonedPoll: a Retry(0) made while a long poll of the
// same Broker, cancelled in the middle of its wait, still waits on the
// server does not feed the message to that poll. The server does not notice
// the caller has gone: the abandoned poll took the message handed back,
// counted a receive nobody saw and hid it for the visibility timeout. A
// draining Worker does exactly this (it cuts its idle polls, then hands
// back what its interrupted handlers leave): the message came back one
// attempt further on, and with a lost ReceiveMessage answer on top it went
// over MaxReceiveCount 3 to the dead-letter queue without a handler seeing
// it (the WorkerShutdownInterrupts conformance case, once in CI).
func TestRetryAfterAbandonedPoll(t *testing.T) {
	ctx := testCtx(t)
	b := newBroker(t, sqs.Options{VisibilityTimeout: 2 * time.Second, WaitTime: 2 * time.Second})
	peer := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second})
	q := declare(t, b, "abandoned", false, sqs.QueueConfig{})
	m := &sdk.Message{Body: []byte("x")}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]

	// A long poll of the now empty queue, cancelled once its request has
	// been written (and given the server a moment to start its wait).
	var once sync.Once
	wrote := make(chan struct{})
	pctx, cancel := context.WithCancel(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { once.Do(func() { close(wrote) }) },
	}))
	errc := make(chan error, 1)
	go func() {
		ds, err := b.Receive(pctx, q, 10)
		if err == nil && len(ds) > 0 {
			err = errors.New("the long poll returned a delivery")
		}
		errc <- err
	}()
	select {
	case <-wrote:
	case <-ctx.Done():
		t.Fatal("the long poll's request was never written")
	}
	time.Sleep(200 * time.Millisecond) // not an assertion: lets the server start waiting
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled Receive returned %v, want context.Canceled", err)
	}

	if err := d.Retry(ctx, 0, errors.New("handed back")); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	back := receiveN(t, peer, q, 1)[0]
	if back.Message().ID != m.ID || back.Attempt() != 2 {
		t.Fatalf("after the hand-back: message %s with Attempt() %d, want %s with 2 (one receive more than the first)",
			back.Message().ID, back.Attempt(), m.ID)
	}
	if err := back.Ack(ctx); err != nil {
		t.Fatalf("Ack: %v", err)
	}
}
