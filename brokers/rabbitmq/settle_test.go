package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestFailedCopyKeepsOriginal: when the copy of Retry or DeadLetter cannot
// be published (its delay queue or dead-letter exchange does not exist),
// the settlement fails and the original comes back, its attempt counted;
// nothing is lost and the publisher recovers for the next message.
func TestFailedCopyKeepsOriginal(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// The queue is declared with the default topology; the broker under
	// test never declares (NoDeclare), so its delay queues do not exist,
	// and it dead-letters through an exchange that does not exist either.
	if err := newBroker(t, url, Options{Logger: quiet}).DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	b := newBroker(t, url, Options{NoDeclare: true, DeadLetterExchange: q + ".missing-dlx", Logger: quiet})
	m := &sdk.Message{Type: "copy-fails"}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		name   string
		settle func(d sdk.Delivery) error
		want   error
	}{
		{"Retry to a missing delay queue", func(d sdk.Delivery) error { return d.Retry(ctx, time.Minute, errors.New("boom")) }, sdk.ErrNotFound},
		{"DeadLetter to a missing exchange", func(d sdk.Delivery) error { return d.DeadLetter(ctx, errors.New("boom")) }, sdk.ErrNotFound},
	}
	for i, s := range steps {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		d := ds[0]
		if d.Message().ID != m.ID || d.Attempt() != i+1 {
			t.Fatalf("%s: got %s attempt %d, want %s attempt %d", s.name, d.Message().ID, d.Attempt(), m.ID, i+1)
		}
		if err := s.settle(d); !errors.Is(err, s.want) {
			t.Fatalf("%s: %v, want an error wrapping %v", s.name, err, s.want)
		}
		if err := d.Ack(ctx); !errors.Is(err, sdk.ErrAlreadySettled) {
			t.Errorf("%s: Ack after the failed settlement: %v, want ErrAlreadySettled", s.name, err)
		}
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Message().ID != m.ID || ds[0].Attempt() != 3 {
		t.Fatalf("after two failed settlements got %s attempt %d, want %s attempt 3", ds[0].Message().ID, ds[0].Attempt(), m.ID)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, q, &sdk.Message{Type: "after"}); err != nil {
		t.Fatalf("Publish after the publish channel was closed by a 404: %v", err)
	}
}

// TestQueueDeletedUnderConsumer: when the queue is deleted while consumed,
// the broker declares it again and resumes: the consumer comes back and
// Publish works again (its first try may report the queue missing).
func TestQueueDeletedUnderConsumer(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet, Reconnect: sdk.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Publish(ctx, q, &sdk.Message{Type: "before"}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	deleteQueues(t, url, q)

	m := &sdk.Message{Type: "after"}
	for {
		err := b.Publish(ctx, q, m)
		if err == nil {
			break
		}
		if !errors.Is(err, sdk.ErrNotFound) {
			t.Fatalf("Publish after the queue was deleted: %v, want success or ErrNotFound", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ds, err = b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatalf("Receive after the queue was deleted and declared again: %v", err)
	}
	if ds[0].Message().ID != m.ID {
		t.Fatalf("received %s, want %s", ds[0].Message().ID, m.ID)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Info(ctx, DeadLetterQueue(q)); err != nil {
		t.Errorf("dead-letter queue not declared again: %v", err)
	}
}
