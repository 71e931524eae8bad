package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A producer publishes through a proxy that lets its requests reach the
// broker but holds the broker's answer (the publisher confirm, the commit's
// reply, the HTTP response): Publish fails although the broker has the
// messages. The producer retries the same messages once the network is
// back. The broker then holds every job twice — transport duplicates — and
// the idempotency guard must turn them into one charge each.
func TestScenarioLostPublishConfirm(t *testing.T) {
	ep := endpoints{pg: PostgresDSN(t)}
	for _, kind := range []string{"rabbitmq", "postgres", "sqs"} {
		t.Run(kind, func(t *testing.T) {
			var target string
			switch kind {
			case "rabbitmq":
				ep.amqp = RabbitMQURL(t)
				target = urlHostPort("5672")(ep.amqp)
			case "sqs":
				ep.sqs = SQSEndpoint(t)
				target = urlHostPort("80")(ep.sqs)
			case "postgres":
				target = urlHostPort("5432")(ep.pg)
			}
			r := setupBilling(t, kind, ep)
			proxy := StartProxy(t, target)
			pub := r.proxiedPublisher(kind, proxy.Addr())
			r.publish(0) // the two poison jobs

			const n = 20
			ordersTable := pgx.Identifier{r.schema, "orders"}.Sanitize()
			var msgs []*sdk.Message
			for i := range n {
				c := charge{OrderID: fmt.Sprintf("order_lc_%d", i), Amount: int64(500 + i)}
				if _, err := r.pool.Exec(context.Background(), `INSERT INTO `+ordersTable+` (id, amount) VALUES ($1, $2)`, c.OrderID, c.Amount); err != nil {
					t.Fatal(err)
				}
				r.orders = append(r.orders, c)
				m, err := sdk.NewJSON(chargeType, c)
				if err != nil {
					t.Fatal(err)
				}
				m.IdempotencyKey = "charge:" + c.OrderID + ":v1"
				msgs = append(msgs, m)
			}
			// Warm up: the publisher's connection and queue declaration.
			warm := r.stageOrder(t, "order_lc_warm")
			if err := pub.Publish(context.Background(), r.queue, warm); err != nil {
				t.Fatal(err)
			}

			proxy.FreezeReplies()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := pub.Publish(ctx, r.queue, msgs...)
			cancel()
			if err == nil {
				t.Fatal("Publish succeeded without its answer")
			}
			t.Logf("publish with the answer lost: %v", err)
			time.Sleep(500 * time.Millisecond) // the broker finishes what it received
			proxy.Reset()                      // the answer is gone with the connection
			proxy.Thaw()
			// The producer retries the very same messages.
			ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
			err = pub.Publish(ctx, r.queue, msgs...)
			cancel()
			if err != nil {
				t.Fatalf("retry: %v", err)
			}

			stats := &idempotency.Stats{}
			r.finish(2, stats)
			r.check(stats)
			dups := stats.Snapshot().DuplicatesSuppressed
			t.Logf("%s: %d jobs published twice (answer lost, retried), %d duplicates suppressed, %+v", kind, n, dups, stats.Snapshot())
			// RabbitMQ and PostgreSQL receive all n before the answer is
			// held; SQS sends batches of ten one after the other, so only
			// the first reached it.
			if dups == 0 || dups > n {
				t.Errorf("%d duplicates suppressed, want 1..%d transport duplicates: the lost answer did not leave the first publish on the broker", dups, n)
			}
		})
	}
}

// stageOrder inserts an order and returns its charge job.
func (r *billingRun) stageOrder(t *testing.T, id string) *sdk.Message {
	t.Helper()
	c := charge{OrderID: id, Amount: 1}
	if _, err := r.pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{r.schema, "orders"}.Sanitize()+` (id, amount) VALUES ($1, $2)`, c.OrderID, c.Amount); err != nil {
		t.Fatal(err)
	}
	r.orders = append(r.orders, c)
	m, err := sdk.NewJSON(chargeType, c)
	if err != nil {
		t.Fatal(err)
	}
	m.IdempotencyKey = "charge:" + c.OrderID + ":v1"
	return m
}

// proxiedPublisher opens a second broker of kind that reaches the server
// through addr, for publishing only; it is closed when the test ends.
func (r *billingRun) proxiedPublisher(kind, addr string) sdk.Publisher {
	t := r.t
	ctx := context.Background()
	via := func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		u.Host = addr
		return u.String()
	}
	switch kind {
	case "rabbitmq":
		b, err := rabbitmq.New(ctx, via(r.ep.amqp), rabbitmq.Options{ConnectionName: "berth-lost-confirm", Heartbeat: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	case "postgres":
		pool, err := pgxpool.New(ctx, via(r.ep.pg))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		b, err := postgres.New(pool, postgres.Options{Schema: r.schema, Lease: e2eLease, MaxAttempts: 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	case "sqs":
		tr := &http.Transport{DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
		t.Cleanup(tr.CloseIdleConnections)
		cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("berth", "berth", "")}
		b, err := sqs.NewFromConfig(cfg, sqs.Options{VisibilityTimeout: e2eLease}, func(o *awssqs.Options) {
			o.BaseEndpoint = aws.String(via(r.ep.sqs))
			o.HTTPClient = &http.Client{Transport: tr}
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	t.Fatalf("unknown broker %q", kind)
	return nil
}
