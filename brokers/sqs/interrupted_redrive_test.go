package sqs_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go/middleware"

	"github.com/berthq/berth/brokers/sqs"
)

// TestRedriveInterruptedBetweenSendAndDelete: a redrive (or purge) whose
// ctx ends after a page's copies were sent to the queue, before the
// letters were deleted from the dead-letter queue (the operator's Ctrl-C,
// berth dlq redrive -timeout), cut the delete: the letters stayed dead
// letters while their copies ran, so the next redrive published them
// again (each job twice), and the call counted none of them. A page once
// sent is now finished whatever ctx does; ctx stops the call between pages.
func TestRedriveInterruptedBetweenSendAndDelete(t *testing.T) {
	t.Parallel()
	var ctrlC interruption
	hook := onOperation("DeleteMessageBatch", func(context.Context) error {
		ctrlC.cut() // just after the send
		return nil
	})
	b := newBroker(t, fastOptions(), hook)
	q := declare(t, b, "redrivecut", false, sqs.QueueConfig{})
	fillDeadLetters(t, b, q, 5)
	raw := newClient(t)

	n, err := b.RedriveDeadLetters(ctrlC.start(t), q)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("RedriveDeadLetters interrupted = %d, %v; want context.Canceled", n, err)
	}
	back := drainRaw(t, raw, queueURL(t, raw, q))
	left := drainRaw(t, raw, queueURL(t, raw, q+"-dlq"))
	if back == 0 || back+left != 5 || n != back {
		t.Errorf("interrupted redrive: %d copies in the queue and %d dead letters left of 5, returned %d: "+
			"want the page sent finished (a letter both redriven and still dead-lettered runs twice) and counted", back, left, n)
	}
}

// TestPurgeInterruptedAsADeleteAnswers: a purge whose ctx ends while a
// page's DeleteMessageBatch is answered (the operator's Ctrl-C as the
// answer arrives) lost the answer: SQS had deleted the page, but the call
// counted none of it, and berth dlq purge reported fewer purged than it
// did. The page in hand is now finished and counted; ctx stops the purge
// between pages.
func TestPurgeInterruptedAsADeleteAnswers(t *testing.T) {
	t.Parallel()
	var ctrlC interruption
	// After the answer came, the caller's ctx ends: the SDK gives the
	// call's ctx error instead of the answer, as it does when ctx ends
	// while it reads the response.
	answered := func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("berthCutAnswer",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleFinalize(ctx, in)
				if err == nil && awsmiddleware.GetOperationName(ctx) == "DeleteMessageBatch" && ctrlC.cut() {
					if ctx.Err() != nil {
						return middleware.FinalizeOutput{}, md, ctx.Err()
					}
				}
				return out, md, err
			}), middleware.After)
	}
	b := newBroker(t, fastOptions(), answered)
	q := declare(t, b, "purgecut", false, sqs.QueueConfig{})
	fillDeadLetters(t, b, q, 5)
	raw := newClient(t)

	n, err := b.PurgeDeadLetters(ctrlC.start(t), q)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("PurgeDeadLetters interrupted = %d, %v; want context.Canceled", n, err)
	}
	left := drainRaw(t, raw, queueURL(t, raw, q+"-dlq"))
	if left == 5 || n != 5-left {
		t.Errorf("interrupted purge returned %d, but %d of the 5 dead letters were deleted", n, 5-left)
	}
}

// interruption is an operator's Ctrl-C at a chosen call: a hook calls cut,
// which ends the ctx start returned, once.
type interruption struct {
	armed  atomic.Bool
	cancel atomic.Pointer[context.CancelFunc]
}

// start returns the ctx cut ends, and arms cut.
func (i *interruption) start(t *testing.T) context.Context {
	ctx, stop := context.WithCancel(testCtx(t))
	t.Cleanup(stop)
	i.cancel.Store(&stop)
	i.armed.Store(true)
	return ctx
}

// cut ends start's ctx the first time it is called after start; it
// reports whether it did.
func (i *interruption) cut() bool {
	if !i.armed.CompareAndSwap(true, false) {
		return false
	}
	(*i.cancel.Load())()
	return true
}
