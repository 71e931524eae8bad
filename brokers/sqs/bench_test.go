package sqs_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// Benchmarks run berth and a raw aws-sdk-go-v2 loop with the same batching
// (10 per ReceiveMessage, 10 per DeleteMessageBatch / SendMessageBatch) side
// by side, each b.N messages, and report msgs/s and SQS API calls per
// message, counted by an APIOptions middleware on the SDK's stack:
//
//	.ci/start-sqs && go test -run '^$' -bench . -benchtime 3000x ./brokers/sqs/

// benchQueue declares a queue and returns the broker, its client's call
// counter and the queue's name and URL.
func benchQueue(b *testing.B) (*sqs.Broker, *calls, string, string) {
	b.Helper()
	c := newCalls()
	br := newBroker(b, sqs.Options{VisibilityTimeout: time.Minute, WaitTime: time.Second}, c.option)
	q := declare(b, br, "bench", false, sqs.QueueConfig{})
	out, err := br.Client().GetQueueUrl(context.Background(), &awssqs.GetQueueUrlInput{QueueName: aws.String(q)})
	if err != nil {
		b.Fatal(err)
	}
	return br, c, q, aws.ToString(out.QueueUrl)
}

// fill publishes n small messages through berth (outside the timer).
func fill(b *testing.B, br *sqs.Broker, q string, n int) {
	b.Helper()
	ctx := context.Background()
	batch := make([]*sdk.Message, 0, 10)
	for i := range n {
		batch = append(batch, &sdk.Message{Type: "bench", Body: []byte(`{"order":"` + strconv.Itoa(i) + `"}`)})
		if len(batch) == 10 || i == n-1 {
			if err := br.Publish(ctx, q, batch...); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

func report(b *testing.B, c *calls, start time.Time, n int, apiCalls int) {
	el := time.Since(start)
	if a := c.get("attempts"); a > c.total() {
		b.Logf("%d HTTP attempts for %d operations: the SDK retried", a, c.total())
	}
	b.ReportMetric(float64(n)/el.Seconds(), "msgs/s")
	b.ReportMetric(float64(apiCalls)/float64(n), "calls/msg")
}

// BenchmarkReceiveDelete: consume b.N messages, receive + delete.
func BenchmarkReceiveDelete(b *testing.B) {
	b.Run("raw", func(b *testing.B) {
		br, c, _, url := benchQueue(b)
		fill(b, br, queueName(url), b.N)
		client := br.Client()
		ctx := context.Background()
		c.reset()
		b.ResetTimer()
		start := time.Now()
		for got := 0; got < b.N; {
			out, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
				QueueUrl: aws.String(url), MaxNumberOfMessages: 10, VisibilityTimeout: 60, WaitTimeSeconds: 1,
				MessageAttributeNames:       []string{"All"},
				MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
			})
			if err != nil {
				b.Fatal(err)
			}
			if len(out.Messages) == 0 {
				continue
			}
			entries := make([]sqstypes.DeleteMessageBatchRequestEntry, len(out.Messages))
			for i, m := range out.Messages {
				entries[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
			}
			del, err := client.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
			if err != nil || len(del.Failed) > 0 {
				b.Fatal(err, del.Failed)
			}
			got += len(out.Messages)
		}
		b.StopTimer()
		report(b, c, start, b.N, c.get("ReceiveMessage")+c.get("DeleteMessageBatch"))
	})
	b.Run("berth", func(b *testing.B) {
		br, c, q, _ := benchQueue(b)
		fill(b, br, q, b.N)
		ctx := context.Background()
		c.reset()
		b.ResetTimer()
		start := time.Now()
		for got := 0; got < b.N; {
			ds, err := br.Receive(ctx, q, 10)
			if err != nil {
				b.Fatal(err)
			}
			for _, d := range ds {
				if err := d.Ack(ctx); err != nil {
					b.Fatal(err)
				}
			}
			got += len(ds)
		}
		if err := br.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		report(b, c, start, b.N, c.get("ReceiveMessage")+c.get("DeleteMessageBatch"))
	})
	b.Run("berth-worker", func(b *testing.B) {
		br, c, q, _ := benchQueue(b)
		fill(b, br, q, b.N)
		var done atomic.Int64
		finished := make(chan struct{})
		h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
			if done.Add(1) == int64(b.N) {
				close(finished)
			}
			return nil
		})
		w, err := sdk.NewWorker(br, h, sdk.WorkerOptions{Queue: q, Concurrency: 16, Lease: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		c.reset()
		b.ResetTimer()
		start := time.Now()
		go func() { errc <- w.Run(ctx) }()
		<-finished
		cancel()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		// The calls of the final empty polls are counted too.
		report(b, c, start, b.N, c.get("ReceiveMessage")+c.get("DeleteMessageBatch"))
	})
}

// BenchmarkPublish: publish b.N messages in batches of 10.
func BenchmarkPublish(b *testing.B) {
	body := []byte(`{"order":"order_123","amount":1999}`)
	b.Run("raw", func(b *testing.B) {
		br, c, _, url := benchQueue(b)
		client := br.Client()
		ctx := context.Background()
		c.reset()
		b.ResetTimer()
		start := time.Now()
		for sent := 0; sent < b.N; {
			n := min(10, b.N-sent)
			entries := make([]sqstypes.SendMessageBatchRequestEntry, n)
			for i := range entries {
				entries[i] = sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(body))}
			}
			out, err := client.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
			if err != nil || len(out.Failed) > 0 {
				b.Fatal(err)
			}
			sent += n
		}
		b.StopTimer()
		report(b, c, start, b.N, c.get("SendMessageBatch"))
	})
	// raw-attrs carries what berth carries (ID, type, correlation ID) as
	// native message attributes, as an application without berth would.
	b.Run("raw-attrs", func(b *testing.B) {
		br, c, _, url := benchQueue(b)
		client := br.Client()
		ctx := context.Background()
		str := func(v string) sqstypes.MessageAttributeValue {
			return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		}
		c.reset()
		b.ResetTimer()
		start := time.Now()
		for sent := 0; sent < b.N; {
			n := min(10, b.N-sent)
			entries := make([]sqstypes.SendMessageBatchRequestEntry, n)
			for i := range entries {
				id := sdk.NewID()
				entries[i] = sqstypes.SendMessageBatchRequestEntry{
					Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(body)),
					MessageAttributes: map[string]sqstypes.MessageAttributeValue{
						"id": str(id), "type": str("bench"), "correlation-id": str(id),
					},
				}
			}
			out, err := client.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
			if err != nil || len(out.Failed) > 0 {
				b.Fatal(err)
			}
			sent += n
		}
		b.StopTimer()
		report(b, c, start, b.N, c.get("SendMessageBatch"))
	})
	b.Run("berth", func(b *testing.B) {
		br, c, q, _ := benchQueue(b)
		ctx := context.Background()
		c.reset()
		b.ResetTimer()
		start := time.Now()
		for sent := 0; sent < b.N; {
			n := min(10, b.N-sent)
			msgs := make([]*sdk.Message, n)
			for i := range msgs {
				msgs[i] = &sdk.Message{Type: "bench", Body: body}
			}
			if err := br.Publish(ctx, q, msgs...); err != nil {
				b.Fatal(err)
			}
			sent += n
		}
		b.StopTimer()
		report(b, c, start, b.N, c.get("SendMessageBatch"))
	})
}

// queueName is the last path segment of a queue URL.
func queueName(url string) string {
	for i := len(url) - 1; i >= 0; i-- {
		if url[i] == '/' {
			return url[i+1:]
		}
	}
	return url
}
