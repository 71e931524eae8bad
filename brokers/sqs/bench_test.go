package sqs_test

import (
	"context"
	"fmt"
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

// The benchmarks run berth and a raw aws-sdk-go-v2 loop with the same
// batching (10 per ReceiveMessage, DeleteMessageBatch and SendMessageBatch)
// side by side in one run: they alternate in rounds of 100 messages, so that
// the load of a shared machine falls on both alike. They report msgs/s of
// each, berth's ratio to raw, and SQS API calls per message, counted by an
// APIOptions middleware on the SDK's stack (one per operation):
//
//	.ci/start-sqs && go test -run '^$' -bench . -benchtime 3000x ./brokers/sqs/

const round = 100

// benchQueue declares a queue and returns a broker whose client counts its
// calls, the counter, and the queue's name and URL.
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

// fill publishes n small messages through berth (outside the timings).
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

// side is one contestant: its time, message count and call counter.
type side struct {
	name    string
	elapsed time.Duration
	n       int
	c       *calls
	ops     []string // the operations that count
}

func (s *side) time(f func()) {
	start := time.Now()
	f()
	s.elapsed += time.Since(start)
}

func (s *side) rate() float64 { return float64(s.n) / s.elapsed.Seconds() }

func (s *side) report(b *testing.B) {
	b.ReportMetric(s.rate(), s.name+"-msgs/s")
	ops := 0
	for _, op := range s.ops {
		ops += s.c.get(op)
	}
	b.ReportMetric(float64(ops)/float64(s.n), s.name+"-calls/msg")
	if a, t := s.c.get("attempts"), s.c.total(); a > t {
		b.Logf("%s: %d HTTP attempts for %d operations: the SDK retried", s.name, a, t)
	}
}

// BenchmarkReceiveDelete consumes b.N messages with each of raw and berth
// (Receive, then Ack of each delivery, buffered into DeleteMessageBatch).
func BenchmarkReceiveDelete(b *testing.B) {
	rawB, rawC, _, rawURL := benchQueue(b)
	br, berthC, q, _ := benchQueue(b)
	fill(b, rawB, queueName(rawURL), b.N)
	fill(b, br, q, b.N)
	client := rawB.Client()
	ctx := context.Background()
	raw := &side{name: "raw", c: rawC, ops: []string{"ReceiveMessage", "DeleteMessageBatch"}}
	berth := &side{name: "berth", c: berthC, ops: []string{"ReceiveMessage", "DeleteMessageBatch"}}
	rawC.reset()
	berthC.reset()
	b.ResetTimer()
	for raw.n < b.N {
		n := min(round, b.N-raw.n)
		raw.time(func() {
			for got := 0; got < n; {
				out, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
					QueueUrl: aws.String(rawURL), MaxNumberOfMessages: int32(min(10, n-got)), VisibilityTimeout: 60, WaitTimeSeconds: 1,
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
				del, err := client.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(rawURL), Entries: entries})
				if err != nil || len(del.Failed) > 0 {
					b.Fatal(err, del.Failed)
				}
				got += len(out.Messages)
			}
		})
		raw.n += n
		berth.time(func() {
			for got := 0; got < n; {
				ds, err := br.Receive(ctx, q, n-got)
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
		})
		berth.n += n
	}
	b.StopTimer()
	raw.report(b)
	berth.report(b)
	b.ReportMetric(berth.rate()/raw.rate(), "berth/raw")
}

// BenchmarkWorker consumes b.N messages with an sdk.Worker (16 handlers,
// heartbeats on) and a no-op handler: the realistic path, not alternated;
// with one Receive loop (one long poll in flight) and with four.
func BenchmarkWorker(b *testing.B) {
	for _, loops := range []int{1, 4} {
		b.Run(fmt.Sprintf("loops=%d", loops), func(b *testing.B) { benchWorker(b, loops) })
	}
}

func benchWorker(b *testing.B, loops int) {
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
	w, err := sdk.NewWorker(br, h, sdk.WorkerOptions{Queue: q, Concurrency: 16, ReceiveLoops: loops, Lease: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	c.reset()
	s := &side{name: "worker", c: c, ops: []string{"ReceiveMessage", "DeleteMessageBatch"}, n: b.N}
	b.ResetTimer()
	s.time(func() {
		go func() { errc <- w.Run(ctx) }()
		<-finished
		cancel()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	})
	b.StopTimer()
	s.report(b) // the drain's last empty polls count too
}

// BenchmarkPublish publishes b.N messages with each of raw (bare bodies),
// raw-attrs (the same bodies with ID, type and correlation ID as three native
// message attributes, as an application without berth would carry them) and
// berth, in batches of 10.
func BenchmarkPublish(b *testing.B) {
	body := []byte(`{"order":"order_123","amount":1999}`)
	rawB, rawC, _, rawURL := benchQueue(b)
	attrB, attrC, _, attrURL := benchQueue(b)
	br, berthC, q, _ := benchQueue(b)
	ctx := context.Background()
	str := func(v string) sqstypes.MessageAttributeValue {
		return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	rawSend := func(client *awssqs.Client, url string, n int, attrs bool) {
		for sent := 0; sent < n; {
			k := min(10, n-sent)
			entries := make([]sqstypes.SendMessageBatchRequestEntry, k)
			for i := range entries {
				entries[i] = sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(body))}
				if attrs {
					id := sdk.NewID()
					entries[i].MessageAttributes = map[string]sqstypes.MessageAttributeValue{
						"id": str(id), "type": str("bench"), "correlation-id": str(id),
					}
				}
			}
			out, err := client.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
			if err != nil || len(out.Failed) > 0 {
				b.Fatal(err)
			}
			sent += k
		}
	}
	raw := &side{name: "raw", c: rawC, ops: []string{"SendMessageBatch"}}
	attr := &side{name: "raw-attrs", c: attrC, ops: []string{"SendMessageBatch"}}
	berth := &side{name: "berth", c: berthC, ops: []string{"SendMessageBatch"}}
	rawC.reset()
	attrC.reset()
	berthC.reset()
	b.ResetTimer()
	for raw.n < b.N {
		n := min(round, b.N-raw.n)
		raw.time(func() { rawSend(rawB.Client(), rawURL, n, false) })
		raw.n += n
		attr.time(func() { rawSend(attrB.Client(), attrURL, n, true) })
		attr.n += n
		berth.time(func() {
			for sent := 0; sent < n; {
				k := min(10, n-sent)
				msgs := make([]*sdk.Message, k)
				for i := range msgs {
					msgs[i] = &sdk.Message{Type: "bench", Body: body}
				}
				if err := br.Publish(ctx, q, msgs...); err != nil {
					b.Fatal(err)
				}
				sent += k
			}
		})
		berth.n += n
	}
	b.StopTimer()
	raw.report(b)
	attr.report(b)
	berth.report(b)
	b.ReportMetric(berth.rate()/raw.rate(), "berth/raw")
	b.ReportMetric(berth.rate()/attr.rate(), "berth/raw-attrs")
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
