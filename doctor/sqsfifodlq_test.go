package doctor_test

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/doctor"
)

// TestSQSFIFODeadLetterRetention: SQS resets a FIFO message's enqueue time
// when it moves it to the dead-letter queue (a standard queue's keeps its
// original one), so a FIFO dead-letter queue that keeps messages for less
// time than its queue still keeps each dead letter that long from its
// failure: nothing expires early. Doctor reported it as an error, "dead
// letters expire early", on a FIFO queue of 14 days' retention with a
// dead-letter queue of SQS's default 4. The standard queue beside it, with
// the same retentions, is still an error.
func TestSQSFIFODeadLetterRetention(t *testing.T) {
	fifo, std := "ordered.fifo", "plain"
	b, sb := openSQS(t, &fifo, &std)
	ctx := testCtx(t)
	c := sb.Client()
	for _, q := range []string{fifo, std} {
		if err := sb.DeclareQueue(ctx, q); err != nil {
			t.Fatal(err)
		}
		u, err := c.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(q)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: u.QueueUrl,
			Attributes: map[string]string{"MessageRetentionPeriod": "1209600"}}); err != nil { // 14 days
			t.Fatal(err)
		}
		dlq := q + "-dlq"
		if q == fifo {
			dlq = fifo[:len(fifo)-len(".fifo")] + "-dlq.fifo"
		}
		d, err := c.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(dlq)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: d.QueueUrl,
			Attributes: map[string]string{"MessageRetentionPeriod": "345600"}}); err != nil { // 4 days
			t.Fatal(err)
		}
	}
	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{fifo, std}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "sqs.dlq-retention", fifo, doctor.OK)
	expect(t, fs, "sqs.dlq-retention", std, doctor.Error)
}
