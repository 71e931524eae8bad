package sqs_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// holdElsewhere publishes n dead letters of q and has another reader (a
// raw receive, as another process's listing would) hold one of them
// invisible for hold; it returns a func that makes it visible again.
func holdElsewhere(t *testing.T, b *sqs.Broker, q string, n int, hold time.Duration) (release func()) {
	t.Helper()
	ctx := testCtx(t)
	for range n {
		if err := b.Publish(ctx, q+"-dlq", &sdk.Message{ID: sdk.NewID(), Type: "dl", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	raw := newClient(t)
	url := queueURL(t, raw, q+"-dlq")
	var handle *string
	for handle == nil {
		out, err := raw.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 1,
			VisibilityTimeout: int32(hold / time.Second), WaitTimeSeconds: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 1 {
			handle = out.Messages[0].ReceiptHandle
		}
	}
	return func() {
		_, _ = raw.ChangeMessageVisibility(testCtx(t), &awssqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(url),
			ReceiptHandle: handle, VisibilityTimeout: 0})
	}
}

// A redrive of all ended at the first empty receive, so a dead letter that
// another reader held invisible at that moment (a listing in the
// dashboard, another redrive) was passed over, and the call reported
// success with the letter still in the dead-letter queue. It now scans on
// while the queue's counters show letters it does not hold, for up to a
// hold: one released meanwhile is redriven too.
func TestRedriveAllWaitsForLettersHeldElsewhere(t *testing.T) {
	t.Parallel()
	b := newBroker(t, fastOptions())
	sqs.SetScanLimits(b, 10*time.Second, 10000)
	q := declare(t, b, "redriveunseen", false, sqs.QueueConfig{})
	holdElsewhere(t, b, q, 3, 2*time.Second) // lapses within the scan's wait
	n, err := b.RedriveDeadLetters(testCtx(t), q)
	if n != 3 || err != nil {
		t.Fatalf("RedriveDeadLetters(all) = %d, %v; want 3, nil", n, err)
	}
	if left, err := b.ListDeadLetters(testCtx(t), q, 10); err != nil || len(left) != 0 {
		t.Fatalf("after redrive all: %d dead letters, %v; want none", len(left), err)
	}
}

// A letter held elsewhere for longer than the wait is reported: the
// redrive of all returns a *ScanError counting it, not success.
func TestRedriveAllReportsLettersHeldElsewhere(t *testing.T) {
	t.Parallel()
	b := newBroker(t, fastOptions())
	sqs.SetScanLimits(b, 2*time.Second, 10000)
	q := declare(t, b, "redriveheld", false, sqs.QueueConfig{})
	release := holdElsewhere(t, b, q, 3, time.Minute)
	n, err := b.RedriveDeadLetters(testCtx(t), q)
	var se *sqs.ScanError
	if n != 2 || !errors.As(err, &se) || se.Remaining != 1 {
		t.Fatalf("RedriveDeadLetters(all) = %d, %v; want 2 and a *ScanError with 1 remaining", n, err)
	}
	release()
	if left, err := b.ListDeadLetters(testCtx(t), q, 10); err != nil || len(left) != 1 {
		t.Fatalf("after redrive all: %d dead letters, %v; want the one held elsewhere", len(left), err)
	}
	// Purge and Get say so too, rather than report every letter gone or
	// an ID not found.
	release = holdElsewhere(t, b, q, 0, time.Minute)
	if _, err := b.PurgeDeadLetters(testCtx(t), q); !errors.As(err, &se) || se.Remaining != 1 {
		t.Fatalf("PurgeDeadLetters = %v; want a *ScanError with 1 remaining", err)
	}
	if _, err := b.GetDeadLetter(testCtx(t), q, "absent"); !errors.As(err, &se) || errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("GetDeadLetter(absent) = %v; want a *ScanError, not ErrNotFound", err)
	}
	if _, err := b.DeleteDeadLetters(testCtx(t), q, "absent"); !errors.As(err, &se) || errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("DeleteDeadLetters(absent) = %v; want a *ScanError, not ErrNotFound", err)
	}
	release()
}
