package sqs_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go/middleware"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// TestSharedSendPanicReachesCaller: a panic in a shared SendMessageBatch
// call (a client middleware, say), which runs on a sender goroutine of the
// broker's, is raised in the goroutine of the Publish that sent the call,
// where it can be recovered (the Worker recovers a handler's), not on the
// sender, where it would end the process. The other Publish of that call
// returns an error instead of waiting for ever, and the broker's one sender
// is free again: a later Publish goes through.
func TestSharedSendPanicReachesCaller(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	var n atomic.Int32
	boom := func(st *middleware.Stack) error {
		return st.Initialize.Add(middleware.InitializeMiddlewareFunc("berthSendBoom",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if awsmiddleware.GetOperationName(ctx) == "SendMessageBatch" {
					switch n.Add(1) {
					case 1: // holds the one sender while two Publish calls queue
						arrived <- struct{}{}
						select {
						case <-release:
						case <-ctx.Done():
							return middleware.InitializeOutput{}, middleware.Metadata{}, ctx.Err()
						}
					case 2: // the call that carries both queued messages
						panic("boom")
					}
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.Before)
	}
	b := newBroker(t, sqs.Options{PublishSenders: 1}, boom)
	q := declare(t, b, "sendpanic", false, sqs.QueueConfig{})
	ctx := testCtx(t)

	first := make(chan error, 1)
	go func() { first <- b.Publish(ctx, q, &sdk.Message{Type: "first", Body: []byte("1")}) }()
	<-arrived

	type outcome struct {
		err       error
		recovered any
	}
	outcomes := make([]outcome, 2)
	var wg sync.WaitGroup
	for i := range outcomes {
		wg.Go(func() {
			defer func() { outcomes[i].recovered = recover() }()
			outcomes[i].err = b.Publish(ctx, q, &sdk.Message{Type: "queued", Body: []byte("2")})
		})
	}
	waitQueued(t, b, 2)
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first Publish: %v", err)
	}
	wg.Wait()
	panicked, failed := 0, 0
	for _, o := range outcomes {
		switch {
		case o.recovered == "boom":
			panicked++
		case o.recovered != nil:
			t.Errorf("recovered %v from Publish, want the call's panic \"boom\"", o.recovered)
		case o.err != nil:
			failed++
		}
	}
	if panicked != 1 || failed != 1 {
		t.Fatalf("of the two Publish calls sharing the call that panicked, %d panicked and %d failed, want 1 and 1: %+v", panicked, failed, outcomes)
	}
	if err := b.Publish(ctx, q, &sdk.Message{Type: "after", Body: []byte("3")}); err != nil {
		t.Fatalf("Publish after a call panicked: %v", err)
	}
}
