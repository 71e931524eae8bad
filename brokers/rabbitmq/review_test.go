package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// deleteOne deletes one queue through a connection of its own, behind the
// broker's back.
func deleteOne(t *testing.T, url, name string) {
	t.Helper()
	ch := ownChannel(t, url, false)
	if _, err := ch.QueueDelete(name, false, false, false); err != nil {
		t.Fatal(err)
	}
}

// TestSettlementRedeclaresDeletedCompanions: when a delay queue or the
// dead-letter queue is deleted behind the broker's back, the settlement
// that finds it missing fails (the original comes back), and the next one
// declares it again, as Publish does for a main queue. Before, every later
// Retry through that bucket failed on this broker until it reconnected,
// sending the message round without its delay until the delivery limit.
//
// Without movers: a mover consuming a quorum delay queue just declared or
// deleted can have its connection closed by RabbitMQ 3.10 (541
// INTERNAL_ERROR), and the reconnection makes this process forget every
// declaration (forgetDeclared). When that landed after the first Retry
// declared the delay queue, the Retry through the deleted queue declared it
// again and succeeded: the failure this test is about never happened. The
// settlement path is the same with or without movers; the delays here are
// the server's.
func TestSettlementRedeclaresDeletedCompanions(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet, MoveDelaysUpTo: -1})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m := &sdk.Message{Type: "companions"}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	receive := func(attempt int) sdk.Delivery {
		t.Helper()
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if ds[0].Message().ID != m.ID || ds[0].Attempt() != attempt {
			t.Fatalf("got %s attempt %d, want %s attempt %d", ds[0].Message().ID, ds[0].Attempt(), m.ID, attempt)
		}
		return ds[0]
	}
	const delay = 250 * time.Millisecond
	if err := receive(1).Retry(ctx, delay, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	d := receive(2)
	deleteOne(t, url, DelayQueue(q, delay))
	if err := d.Retry(ctx, delay, errors.New("boom")); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Retry through the deleted delay queue: %v, want an error wrapping ErrNotFound", err)
	}
	if err := receive(3).Retry(ctx, delay, errors.New("boom")); err != nil {
		t.Fatalf("Retry after a failed one: %v, want the delay queue declared again", err)
	}

	d = receive(4)
	deleteOne(t, url, DeadLetterQueue(q))
	// DeadLetter declares the main queue's topology first when this
	// process has forgotten it (any end of a consumer session, for
	// example the server cancelling it, makes it forget), and then the
	// dead-letter queue is back before the copy is sent: success is the
	// right answer then. Otherwise the copy is returned unroutable, the
	// original comes back, and the next DeadLetter declares the queue.
	switch err := d.DeadLetter(ctx, errors.New("boom")); {
	case err == nil:
	case errors.Is(err, sdk.ErrNotFound):
		if err := receive(5).DeadLetter(ctx, errors.New("boom")); err != nil {
			t.Fatalf("DeadLetter after a failed one: %v, want the dead-letter queue declared again", err)
		}
	default:
		t.Fatalf("DeadLetter to the deleted dead-letter queue: %v, want nil or an error wrapping ErrNotFound", err)
	}
	got, err := b.ListDeadLetters(ctx, q, 10)
	if err != nil || len(got) != 1 || got[0].ID != m.ID {
		t.Fatalf("ListDeadLetters = %d messages, %v; want %s", len(got), err, m.ID)
	}
}

// TestPublishDelayBeyondBuckets: a Publish delay longer than the largest
// delay bucket would be delivered early (after that bucket): it is refused
// with a typed error, and nothing of the batch is published.
func TestPublishDelayBeyondBuckets(t *testing.T) {
	_, q, b := brokerOnQueue(t, Options{Logger: quiet, DelayBuckets: []time.Duration{100 * time.Millisecond, time.Second}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	ok := &sdk.Message{Type: "ok", Delay: time.Second}
	late := &sdk.Message{Type: "late", Delay: time.Second + time.Millisecond}
	err := b.Publish(ctx, q, ok, late)
	var de *DelayError
	if !errors.Is(err, sdk.ErrInvalidMessage) || !errors.As(err, &de) || de.ID != late.ID || de.Max != time.Second {
		t.Fatalf("Publish = %v, want a *DelayError for %s (max 1s) wrapping ErrInvalidMessage", err, late.ID)
	}
	info, err := b.Info(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if info.Ready != 0 || info.Delayed != 0 {
		t.Fatalf("after the refused batch: %d ready, %d delayed; want nothing published", info.Ready, info.Delayed)
	}
}
