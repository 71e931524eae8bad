package sqs_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go/middleware"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// errAnswerLost stands for the answer of a call that reached SQS and was
// applied, then lost on its way back.
var errAnswerLost = errors.New("test: the answer was lost after SQS applied the call")

// loseAnswerOnce is an APIOptions entry that lets the first call of op
// reach SQS and be applied, then fails it as if its answer were lost.
func loseAnswerOnce(op string) func(*middleware.Stack) error {
	var done atomic.Bool
	return func(st *middleware.Stack) error {
		return st.Deserialize.Add(middleware.DeserializeMiddlewareFunc("berthLoseAnswerOnce",
			func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleDeserialize(ctx, in)
				if err == nil && awsmiddleware.GetOperationName(ctx) == op && done.CompareAndSwap(false, true) {
					return middleware.DeserializeOutput{}, md, errAnswerLost
				}
				return out, md, err
			}), middleware.After)
	}
}

// TestShorterExtendLeaseWithLostAnswer: an ExtendLease that shortens the
// lease and fails may still have been applied: the message may be visible
// again from the shorter time on. The delivery kept its longer deadline,
// so a later Ack within it was sent without checking the receipt, and
// SQS answered success to the delete of a message another receiver held —
// deleting nothing, while Ack said done and the message ran again. After a
// failed change the delivery counts the earlier of the two deadlines.
func TestShorterExtendLeaseWithLostAnswer(t *testing.T) {
	ctx := testCtx(t)
	b1 := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second, SyncAck: true},
		loseAnswerOnce("ChangeMessageVisibility"))
	b2 := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second, SyncAck: true})
	q := declare(t, b1, "shortext", false, sqs.QueueConfig{})
	m := &sdk.Message{Body: []byte("x")}
	if err := b1.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	d1 := receiveN(t, b1, q, 1)[0]
	if err := d1.ExtendLease(ctx, time.Second); !errors.Is(err, errAnswerLost) {
		t.Fatalf("ExtendLease = %v, want the lost answer", err)
	}
	d2 := receiveN(t, b2, q, 1)[0] // visible again a second later: the change was applied
	if d2.Message().ID != m.ID {
		t.Fatalf("second receive: %s, want %s", d2.Message().ID, m.ID)
	}
	if err := d1.Ack(ctx); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Fatalf("Ack of the first delivery = %v, want ErrLeaseLost (another receiver holds the message)", err)
	}
	if err := d2.Ack(ctx); err != nil {
		t.Fatalf("Ack of the second delivery: %v", err)
	}
}
