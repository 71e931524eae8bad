package doctor_test

import (
	"context"
	"testing"
	"time"

	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// openSQS returns a broker on the SQS endpoint, with berth's default options;
// queues named by the test are deleted (with their dead-letter queues) when
// it ends.
func openSQS(t *testing.T, names ...*string) (sdk.Broker, *sqs.Broker) {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections) // runs after the broker's Close: no keep-alive goroutine outlives the test
	client := awssqs.New(awssqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(integration.SQSEndpoint(t)),
		Credentials:  credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:   &http.Client{Transport: tr},
	})
	sb, err := sqs.New(client, sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close() })
	var b sdk.Broker = sb
	p := "berth-doctor-" + suffix() + "-"
	for _, n := range names {
		*n = p + *n
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, n := range names {
			_ = sb.DeleteQueue(ctx, *n, true)
		}
	})
	return b, sb
}

func createRaw(t *testing.T, c *awssqs.Client, name string, attrs map[string]string) string {
	t.Helper()
	out, err := c.CreateQueue(testCtx(t), &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.QueueUrl)
}

func TestSQSDefaultsPass(t *testing.T) {
	q := "billing"
	b, sb := openSQS(t, &q)
	if err := sb.DeclareQueue(testCtx(t), q); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{q}})
	if err != nil {
		t.Fatal(err)
	}
	clean(t, fs)
	for _, id := range []string{"sqs.redrive-policy", "sqs.max-receive-count", "sqs.visibility-timeout", "sqs.dlq-retention", "sqs.long-polling"} {
		expect(t, fs, id, q, doctor.OK)
	}
	expect(t, fs, sdk.ConflictMaxAttemptsOverCap, "", doctor.OK)
}

func TestSQSMisconfigured(t *testing.T) {
	raw, lowcap, shortdlq, missing := "raw", "lowcap", "shortdlq", "missing"
	b, sb := openSQS(t, &raw, &lowcap, &shortdlq, &missing)
	ctx := testCtx(t)
	c := sb.Client()
	createRaw(t, c, raw, map[string]string{"VisibilityTimeout": "5"}) // no redrive, short-polling, short visibility
	if err := sb.EnsureQueue(ctx, lowcap, sqs.QueueConfig{MaxReceiveCount: 2}); err != nil {
		t.Fatal(err)
	}
	if err := sb.DeclareQueue(ctx, shortdlq); err != nil {
		t.Fatal(err)
	}
	dlq, err := c.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(shortdlq + "-dlq")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: dlq.QueueUrl,
		Attributes: map[string]string{"MessageRetentionPeriod": "60"}}); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{raw, lowcap, shortdlq, missing}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "sqs.redrive-policy", raw, doctor.Error)
	expect(t, fs, "sqs.long-polling", raw, doctor.Warn)
	expect(t, fs, "sqs.visibility-timeout", raw, doctor.Warn)
	expect(t, fs, "sqs.max-receive-count", lowcap, doctor.Error)
	expect(t, fs, "sqs.dlq-retention", lowcap, doctor.OK)
	expect(t, fs, "sqs.dlq-retention", shortdlq, doctor.Error)
	expect(t, fs, "sqs.queue-missing", missing, doctor.Error)

	fs, err = doctor.Run(ctx, b, doctor.Options{Queues: []string{shortdlq}, LongestJob: 13 * time.Hour, MaxAttempts: 12})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "sqs.visibility-timeout", shortdlq, doctor.Error)
	expect(t, fs, "sqs.max-receive-count", shortdlq, doctor.Error) // 10 < 12
	expect(t, fs, sdk.ConflictMaxAttemptsOverCap, "", doctor.Warn)
}
