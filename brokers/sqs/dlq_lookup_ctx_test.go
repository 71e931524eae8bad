package sqs_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// TestDeadLetterQueueLookupHonoursCtx: the lookup of a queue's dead-letter
// queue (its redrive policy) is shared by the callers that need it, but a
// caller waiting for another's lookup stops when its own ctx ends. It waited
// on a mutex for as long as the other's call took (a blackholed SQS: up to
// that caller's ctx, a Stats without a deadline's forever), past a
// DeadLetter's settle timeout.
func TestDeadLetterQueueLookupHonoursCtx(t *testing.T) {
	admin := newBroker(t, fastOptions())
	q := declare(t, admin, "dlqlookup", false, sqs.QueueConfig{})
	entered, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	var n atomic.Int32
	b := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second},
		onOperation("GetQueueAttributes", func(ctx context.Context) error {
			if !armed.Load() || n.Add(1) != 1 {
				return nil
			}
			close(entered)
			select { // the first lookup hangs until the test lets it go
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}))
	ctx := testCtx(t)
	if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("a")}, &sdk.Message{Body: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	ds := receiveN(t, b, q, 2)
	armed.Store(true)
	first := make(chan error, 1)
	go func() { first <- ds[0].DeadLetter(ctx, errors.New("bad")) }()
	<-entered
	ctx2, cancel := context.WithCancel(ctx)
	second := make(chan error, 1)
	go func() { second <- ds[1].DeadLetter(ctx2, errors.New("bad")) }()
	cancel()
	released := false
	select {
	case err := <-second:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("DeadLetter with its ctx cancelled: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("DeadLetter waited for another caller's dead-letter queue lookup past its own ctx")
		close(release)
		released = true
		<-second
	}
	if !released {
		close(release)
	}
	if err := <-first; err != nil {
		t.Errorf("first DeadLetter: %v", err)
	}
}
