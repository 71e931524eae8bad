package sqs_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// groupOptions are fastOptions with DefaultGroup group.
func groupOptions(group string) sqs.Options {
	o := fastOptions()
	o.DefaultGroup = group
	return o
}

// rawGroup receives one message of queue name with the raw client (no
// berth decoding), deletes it and returns its MessageGroupId.
func rawGroup(t *testing.T, ctx context.Context, b *sqs.Broker, name string) string {
	t.Helper()
	url, err := b.Client().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	for ctx.Err() == nil {
		out, err := b.Client().ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
			QueueUrl:                    url.QueueUrl,
			WaitTimeSeconds:             1,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameMessageGroupId},
		})
		if err != nil {
			t.Fatalf("ReceiveMessage(%s): %v", name, err)
		}
		if len(out.Messages) > 0 {
			if _, err := b.Client().DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: url.QueueUrl, ReceiptHandle: out.Messages[0].ReceiptHandle}); err != nil {
				t.Fatalf("DeleteMessage(%s): %v", name, err)
			}
			return out.Messages[0].Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)]
		}
	}
	t.Fatalf("no message in %s: %v", name, ctx.Err())
	return ""
}

// TestFIFOCopiesKeepReceivedGroup: a berth message published without a Key
// goes to its publisher's Options.DefaultGroup. Its dead letter, made by a
// Broker with another DefaultGroup (another service), and its redrive, by
// yet another, keep the group it was received with. They recomputed it from
// their own DefaultGroup: the message changed group, and lost its FIFO order
// relative to the messages of its own.
func TestFIFOCopiesKeepReceivedGroup(t *testing.T) {
	pub := newBroker(t, groupOptions("group-pub"))
	q := declare(t, pub, "keepgroup", true, sqs.QueueConfig{})
	dlqName := strings.TrimSuffix(q, ".fifo") + "-dlq.fifo"
	ctx := testCtx(t)

	t.Run("dead letter", func(t *testing.T) {
		other := newBroker(t, groupOptions("group-other"))
		if err := pub.Publish(ctx, q, &sdk.Message{Type: "t", Body: []byte("a")}); err != nil {
			t.Fatal(err)
		}
		d := receiveN(t, other, q, 1)[0]
		if err := d.DeadLetter(ctx, errors.New("poison")); err != nil {
			t.Fatal(err)
		}
		if err := other.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if got := rawGroup(t, ctx, other, dlqName); got != "group-pub" {
			t.Errorf("dead letter's MessageGroupId = %q, want the message's own %q", got, "group-pub")
		}
	})

	t.Run("redrive", func(t *testing.T) {
		other := newBroker(t, groupOptions("group-redrive"))
		if err := pub.Publish(ctx, q, &sdk.Message{Type: "t", Body: []byte("b")}); err != nil {
			t.Fatal(err)
		}
		// Dead-lettered by its publisher: the letter is in group-pub
		// whatever the fix.
		d := receiveN(t, pub, q, 1)[0]
		if err := d.DeadLetter(ctx, errors.New("poison")); err != nil {
			t.Fatal(err)
		}
		if err := pub.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if n, err := other.RedriveDeadLetters(ctx, q); err != nil || n != 1 {
			t.Fatalf("RedriveDeadLetters = %d, %v; want 1", n, err)
		}
		if got := rawGroup(t, ctx, other, q); got != "group-pub" {
			t.Errorf("redriven message's MessageGroupId = %q, want the message's own %q", got, "group-pub")
		}
	})
}
