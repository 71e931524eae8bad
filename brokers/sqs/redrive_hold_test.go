package sqs_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// TestRedriveReportsALetterTakenWhileItsCopyWasSent: a redrive's
// SendMessageBatch outlasts the scan's hold on the page (SQS slow, the SDK
// backing off between retries), and another reader (a listing, a raw
// consumer) receives the dead letter meanwhile. The redrive then deleted
// it with its stale receipt, which SQS (and the emulator) answers with
// success while deleting nothing: the call reported the letter redriven,
// with no error, while it stayed in the dead-letter queue, to be redriven
// again by the next redrive (a duplicate job). Now the redrive checks its
// hold before deleting and reports the letter it could not delete.
func TestRedriveReportsALetterTakenWhileItsCopyWasSent(t *testing.T) {
	t.Parallel() // sleep-bound: outlasts a hold
	const hold = 3 * time.Second
	raw := newClient(t)
	var armed atomic.Bool
	var dlqURL atomic.Pointer[string]
	var taken atomic.Pointer[string] // the other reader's receipt handle
	slowSend := onOperation("SendMessageBatch", func(ctx context.Context) error {
		if !armed.CompareAndSwap(true, false) {
			return nil
		}
		time.Sleep(hold + time.Second) // the scan's hold lapses
		out, err := raw.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: dlqURL.Load(), MaxNumberOfMessages: 10, VisibilityTimeout: 30}, sqs.SafeRequestBody())
		if err != nil {
			return err
		}
		if len(out.Messages) == 1 {
			taken.Store(out.Messages[0].ReceiptHandle)
		}
		return nil
	})
	b := newBroker(t, fastOptions(), slowSend)
	sqs.SetScanLimits(b, hold, 10000)
	q := declare(t, b, "redrivehold", false, sqs.QueueConfig{})
	msgs := fillDeadLetters(t, b, q, 1)
	url := queueURL(t, raw, q+"-dlq")
	dlqURL.Store(&url)
	ctx := testCtx(t)

	armed.Store(true)
	n, err := b.RedriveDeadLetters(ctx, q, msgs[0].ID)
	h := taken.Load()
	if h == nil {
		t.Fatalf("the other reader did not receive the dead letter while the copy was sent (RedriveDeadLetters = %d, %v)", n, err)
	}
	// The letter is still in the dead-letter queue (held by the other
	// reader) iff its receipt still changes its visibility.
	_, stillThere := raw.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{QueueUrl: &url, ReceiptHandle: h, VisibilityTimeout: 0})
	if stillThere != nil {
		t.Fatalf("the dead letter was deleted after all (%v): the interleaving did not happen", stillThere)
	}
	if err == nil || n != 0 {
		t.Fatalf("RedriveDeadLetters = %d, %v with the dead letter still in the dead-letter queue; want 0 and an error", n, err)
	}
	if !errors.Is(err, sdk.ErrLeaseLost) {
		t.Errorf("RedriveDeadLetters error %v, want one wrapping sdk.ErrLeaseLost", err)
	}
	// The copy was sent: the queue holds it.
	ds := receiveN(t, b, q, 1)
	if got := ds[0].Message().ID; got != msgs[0].ID {
		t.Errorf("redriven message %s, want %s", got, msgs[0].ID)
	}
}
