package sqs_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// A queue (and its dead-letter queue) whose MaximumMessageSize is below
// Options.MaxWireSize — made outside berth with SQS's historical default of
// 256 KiB, or by a broker with a smaller MaxWireSize, used with berth's
// default 1 MiB. DeadLetter fitted its copy to MaxWireSize only, so SQS
// refused the copy of a message that fit the queue, and the message came
// back until SQS's redrive policy moved it without berth's reason. The copy
// is now fitted to the dead-letter queue's own limit.
func TestDeadLetterFitsTheQueuesOwnLimit(t *testing.T) {
	small := sqs.Options{VisibilityTimeout: 1e9, WaitTime: 1e9, MaxWireSize: 4096, MaxMessageSize: 4096}
	owner := newBroker(t, small)
	q := declare(t, owner, "qlimit", false, sqs.QueueConfig{}) // MaximumMessageSize 4096 on both
	b := newBroker(t, fastOptions())                           // MaxWireSize default 1 MiB
	ctx := testCtx(t)
	m := &sdk.Message{ID: sdk.NewID(), Type: "t", Body: bytes.Repeat([]byte("x"), 3900)}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	t.Logf("wire size %d", sqs.WireSize(m))
	d := receiveN(t, b, q, 1)[0]
	err := d.DeadLetter(ctx, sdk.Permanent(errors.New("boom")))
	if err != nil {
		t.Fatalf("DeadLetter of a message Publish accepted: %v", err)
	}
	got, err := b.GetDeadLetter(ctx, q, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Body, m.Body) || got.Header(sqs.HeaderDeadLetterTruncated) == "" {
		t.Errorf("dead letter: body kept %v, marker %q; want the body whole and the copy marked", bytes.Equal(got.Body, m.Body), got.Header(sqs.HeaderDeadLetterTruncated))
	}
}
