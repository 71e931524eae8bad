package telemetry_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/integration"
)

// TestOneTracePerJob runs the publish → consume → retry → dead-letter trace
// scenario on every broker: the trace headers are shared code, so the same
// trace must come out of each.
func TestOneTracePerJob(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		traceScenario(t, newMemory(t), uniqueQueue(t, "tt"))
	})
	t.Run("rabbitmq", func(t *testing.T) {
		url := integration.RabbitMQURL(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		b, err := rabbitmq.New(ctx, url, rabbitmq.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		queue := uniqueQueue(t, "berth_teltest")
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := b.DeleteQueue(ctx, queue); err != nil {
				t.Errorf("delete queue: %v", err)
			}
		})
		traceScenario(t, b, queue)
	})
	t.Run("sqs", func(t *testing.T) {
		endpoint := integration.SQSEndpoint(t)
		transport := &http.Transport{}
		t.Cleanup(transport.CloseIdleConnections) // runs last: no keep-alive goroutine outlives the test
		client := awssqs.New(awssqs.Options{
			HTTPClient:   &http.Client{Transport: transport},
			Region:       "us-east-1",
			BaseEndpoint: aws.String(endpoint),
			Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		})
		b, err := sqs.New(client, sqs.Options{VisibilityTimeout: 5 * time.Second, WaitTime: time.Second, SyncAck: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		queue := uniqueQueue(t, "berth_teltest")
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := b.DeleteQueue(ctx, queue, true); err != nil {
				t.Errorf("delete queue: %v", err)
			}
		})
		traceScenario(t, b, queue)
	})
	t.Run("jetstream", func(t *testing.T) {
		url := integration.NATSURL(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		b, err := jetstream.Connect(ctx, url, jetstream.ConnectOptions{Name: "berth-teltest"},
			jetstream.Options{AckWait: 5 * time.Second, WaitTime: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		queue := uniqueQueue(t, "berth_teltest")
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := b.DeleteQueue(ctx, queue); err != nil {
				t.Errorf("delete queue: %v", err)
			}
		})
		traceScenario(t, b, queue)
	})
	t.Run("postgres", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		pool, err := pgxpool.New(ctx, integration.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		schema := uniqueQueue(t, "berth_teltest")
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
				t.Errorf("drop schema %s: %v", schema, err)
			}
		})
		b, err := postgres.New(pool, postgres.Options{Schema: schema, Lease: 5 * time.Second, PollInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		if err := b.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		traceScenario(t, b, "tt")
	})
}
