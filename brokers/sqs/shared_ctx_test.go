package sqs_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/sdk"
)

// TestPublishSharedSenderHonoursCtx: a Publish that found a sender free
// and took, with its own message, another Publish's into the call returns
// its ctx's error once its ctx ends, while the call, which the other
// Publish still waits for, goes on: it is not held until the call returns.
// The other message is published, and its Publish hears so.
func TestPublishSharedSenderHonoursCtx(t *testing.T) {
	g := newGate()
	b := newBroker(t, sqs.Options{VisibilityTimeout: time.Minute, WaitTime: time.Second, PublishSenders: 1}, g.option)
	q := declare(t, b, "sharedctx", false, sqs.QueueConfig{})
	ctx := testCtx(t)

	other := &sdk.Message{Type: "other", Body: []byte("1")}
	otherWait, err := sqs.QueueShared(ctx, b, q, other)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mine := &sdk.Message{Type: "mine", Body: []byte("2")}
	errc := make(chan error, 1)
	go func() { errc <- b.Publish(cctx, q, mine) }()
	<-g.arrived // the call carries both messages
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled Publish: %v, want context.Canceled", err)
		}
	case <-ctx.Done():
		close(g.open)
		<-errc
		t.Fatal("the cancelled Publish is held until the shared call it sends returns")
	}
	close(g.open)
	if err := otherWait(); err != nil {
		t.Fatalf("the other Publish: %v", err)
	}
	// The senders are free again: a later Publish is sent.
	if err := b.Publish(ctx, q, &sdk.Message{Type: "later", Body: []byte("3")}); err != nil {
		t.Fatalf("later Publish: %v", err)
	}
}

// TestPublishSharedSenderGonePanic: the shared call of a Publish that
// stopped waiting (its ctx ended) panics afterwards. No caller is left to
// raise it in: it is logged, the other Publish of the call gets an error
// saying its message may have been published, and the broker's one sender
// is free again.
func TestPublishSharedSenderGonePanic(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 10)
	var logs syncbuf.Buffer
	hook := onOperation("SendMessageBatch", func(ctx context.Context) error {
		select {
		case <-release: // later calls go through
			return nil
		default:
		}
		arrived <- struct{}{}
		<-release
		panic("boom")
	})
	b := newBroker(t, sqs.Options{VisibilityTimeout: time.Minute, WaitTime: time.Second, PublishSenders: 1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, hook)
	q := declare(t, b, "sharedgone", false, sqs.QueueConfig{})
	ctx := testCtx(t)

	otherWait, err := sqs.QueueShared(ctx, b, q, &sdk.Message{Type: "other", Body: []byte("1")})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- b.Publish(cctx, q, &sdk.Message{Type: "mine", Body: []byte("2")}) }()
	<-arrived
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Publish: %v, want context.Canceled", err)
	}
	close(release) // the call panics now
	if err := otherWait(); !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("the other Publish: %v, want sdk.ErrUnavailable (the call panicked)", err)
	}
	if err := b.Publish(ctx, q, &sdk.Message{Type: "later", Body: []byte("3")}); err != nil {
		t.Fatalf("later Publish: %v", err)
	}
	if !strings.Contains(logs.String(), "panicked after its Publish stopped waiting") || !strings.Contains(logs.String(), "boom") {
		t.Errorf("the panic was not logged: %q", logs.String())
	}
}
