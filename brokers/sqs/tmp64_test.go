package sqs_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/sdk"
)

func tmpBody() string {
	body := make([]byte, 256)
	for i := range body {
		body[i] = 'a'
	}
	return string(body)
}

func BenchmarkTmp64(b *testing.B) {
	br, _, q, _ := benchQueue(b)
	ctx := context.Background()
	body := []byte(tmpBody())
	next := make(chan struct{}, b.N)
	for range b.N {
		next <- struct{}{}
	}
	close(next)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range next {
				if err := br.Publish(ctx, q, &sdk.Message{Type: "bench", Body: body}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkTmpRaw(b *testing.B) {
	rawB, _, _, url := benchQueue(b)
	ctx := context.Background()
	body := tmpBody()
	next := make(chan struct{}, b.N/10)
	for range b.N / 10 {
		next <- struct{}{}
	}
	close(next)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range next {
				entries := make([]sqstypes.SendMessageBatchRequestEntry, 10)
				for i := range entries {
					id := sdk.NewID()
					entries[i] = sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(body),
						MessageAttributes: map[string]sqstypes.MessageAttributeValue{"berth": {DataType: aws.String("String"), StringValue: aws.String(`{"id":"` + id + `","type":"bench","correlation-id":"` + id + `"}`)}}}
				}
				out, err := rawB.Client().SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
				if err != nil || len(out.Failed) > 0 {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
