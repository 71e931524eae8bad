package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// consumers returns how many consumers q has, or -1 when it does not exist.
func consumers(t *testing.T, conn *amqp.Connection, q string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		return -1
	}
	return info.Consumers
}

// TestConsumerCancelNoDeclareNotFound: with NoDeclare, a queue deleted
// under a waiting Receive (the server cancels the consumer) makes Receive
// return an error wrapping sdk.ErrNotFound instead of waiting for ever.
func TestConsumerCancelNoDeclareNotFound(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{NoDeclare: true, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := newBroker(t, url, Options{Logger: quiet}).DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := b.Receive(ctx, q, 1); errc <- err }()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for consumers(t, conn, q) != 1 {
		time.Sleep(20 * time.Millisecond)
	}
	deleteOne(t, url, q)
	select {
	case err := <-errc:
		if !errors.Is(err, sdk.ErrNotFound) {
			t.Fatalf("Receive after the queue was deleted: %v, want sdk.ErrNotFound", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Receive still waiting 10s after its queue was deleted")
	}
}

// TestConsumerCancelBacksOff: when the server cancels the consumer again
// and again before it delivered anything (here the queue is deleted as soon
// as the consumer is back), the broker re-subscribes with a growing
// backoff (Options.Reconnect), not at the shortest delay for ever.
func TestConsumerCancelBacksOff(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{QueueType: Classic, Logger: quiet,
		Reconnect: sdk.Backoff{Base: 50 * time.Millisecond, Max: 2 * time.Second}})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	go func() { _, _ = b.Receive(ctx, q, 1) }()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Backing off 50ms·2^n, about 6 re-subscriptions fit in 4s; at the
	// shortest delay for ever, about 40 (each also declares the topology).
	resubscribed := 0
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if consumers(t, conn, q) == 1 {
			resubscribed++
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Fatal(err)
			}
			_ = ch.Close()
		}
	}
	t.Logf("re-subscribed %d times in 4s", resubscribed)
	if resubscribed < 2 {
		t.Fatalf("re-subscribed %d times, want the consumer back after a cancel", resubscribed)
	}
	if resubscribed > 12 {
		t.Fatalf("re-subscribed %d times in 4s: no backoff growth between consumer cancels", resubscribed)
	}
}
