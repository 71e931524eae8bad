package sqs_test

import (
	"context"
	"log"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// ExampleNew runs a Worker on an SQS queue. With real AWS, build the client
// with awssqs.NewFromConfig(cfg) from config.LoadDefaultConfig instead; here
// it points at a local emulator (.ci/start-sqs). The example is compiled, not
// run: it needs the server.
func ExampleNew() {
	client := awssqs.New(awssqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("http://127.0.0.1:4566"),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
	b, err := sqs.New(client, sqs.Options{VisibilityTimeout: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	ctx := context.Background()
	if err := b.DeclareQueue(ctx, "billing"); err != nil { // billing + billing-dlq + redrive policy
		log.Fatal(err)
	}
	msg, err := sdk.NewJSON("billing.charge", map[string]string{"order": "order_123"})
	if err != nil {
		log.Fatal(err)
	}
	msg.IdempotencyKey = "charge:order_123:v1"
	if err := b.Publish(ctx, "billing", msg); err != nil {
		log.Fatal(err)
	}

	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		log.Printf("charging %s (attempt %d)", d.Message().IdempotencyKey, d.Attempt())
		return nil
	}), sdk.WorkerOptions{Queue: "billing", Lease: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = w.Run(runCtx) // heartbeats extend the visibility; Run flushes the deletes when it drains
}
