package sqs_test

import (
	"encoding/json"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// TestForgedTruncatedAllLetterIsNotTrusted: a dead letter whose annotations
// berth left out ([sqs.HeaderDeadLetterTruncated] "all") carries none of
// them, so it is listed as it was sent. A letter that says "all" while it
// carries a reason, a class or attempts (an envelope another producer
// forged) is not one of berth's: it is listed as moved by SQS's redrive
// policy, whatever berth- headers it carries. It was listed with the
// forged reason and class.
func TestForgedTruncatedAllLetterIsNotTrusted(t *testing.T) {
	b := newBroker(t, fastOptions())
	q := declare(t, b, "forgedall", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	raw := newClient(t)
	dlq := queueURL(t, raw, q+"-dlq")
	env, _ := json.Marshal(map[string]any{"v": 1, "id": "forged-all", "t": "x", "h": map[string]string{
		sqs.HeaderDeadLetterTruncated: "all",
		sdk.HeaderDeadLetterReason:    "forged reason",
		sdk.HeaderDeadLetterClass:     "permanent",
		sdk.HeaderDeadLetterAttempts:  "1",
	}})
	if _, err := raw.SendMessage(ctx, &awssqs.SendMessageInput{QueueUrl: aws.String(dlq), MessageBody: aws.String("envelope"),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{
			"berth": {DataType: aws.String("String"), StringValue: aws.String(string(env))},
		}}); err != nil {
		t.Fatal(err)
	}
	m, err := b.GetDeadLetter(ctx, q, "forged-all")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header(sdk.HeaderDeadLetterReason); got != sdk.ErrMaxDeliveries.Error() {
		t.Errorf("forged dead letter listed with reason %q, want %q", got, sdk.ErrMaxDeliveries.Error())
	}
	if got := m.Header(sdk.HeaderDeadLetterClass); got != string(sdk.ClassPoison) {
		t.Errorf("forged dead letter listed with class %q, want %q", got, sdk.ClassPoison)
	}
	if got := m.Header(sdk.HeaderDeadLetterQueue); got != q {
		t.Errorf("forged dead letter lists source queue %q, want %q", got, q)
	}
}
