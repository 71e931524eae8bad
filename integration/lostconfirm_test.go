package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	njs "github.com/nats-io/nats.go/jetstream"
)

// A producer publishes through a proxy that lets its requests reach the
// broker but holds the broker's answer (the publisher confirm, the commit's
// reply, the HTTP response, JetStream's publish acks): Publish fails
// although the broker has the messages. The producer retries the same
// messages once the network is back. RabbitMQ, PostgreSQL and SQS then hold
// every job twice — transport duplicates — and the idempotency guard must
// turn them into one charge each. JetStream drops the retried copies by
// their Nats-Msg-Id (the message ID) within the stream's dedupe window: its
// stream holds each job once, and no duplicate reaches a Worker.
func TestScenarioLostPublishConfirm(t *testing.T) {
	ep := endpoints{pg: PostgresDSN(t)}
	for _, kind := range []string{"rabbitmq", "postgres", "sqs", "jetstream"} {
		t.Run(kind, func(t *testing.T) {
			var target string
			switch kind {
			case "jetstream":
				// A private server: its stream is read message by
				// message below, and nothing else publishes to it.
				srv := StartNATS(t)
				ep.nats = srv.URL
				target = fmt.Sprintf("127.0.0.1:%d", srv.Port)
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
			if kind == "jetstream" {
				// The first publish reached the server: the stream holds
				// all n (and the warm-up and the two poison jobs) once.
				streamHoldsOnce(t, r, append(msgs, warm), "before the retry")
			}
			proxy.Reset() // the answer is gone with the connection
			proxy.Thaw()
			// The producer retries the very same messages.
			ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
			retries := 1
			err = pub.Publish(ctx, r.queue, msgs...)
			// A JetStream Publish made while its connection is still
			// going down (the reset not yet seen, or being reconnected)
			// fails with ErrUnavailable: its acks went with the
			// connection. The producer retries the same messages again,
			// as it would any unavailable broker, until one is answered.
			for kind == "jetstream" && errors.Is(err, sdk.ErrUnavailable) && ctx.Err() == nil {
				t.Logf("retry %d: %v", retries, err)
				time.Sleep(100 * time.Millisecond)
				retries++
				err = pub.Publish(ctx, r.queue, msgs...)
			}
			cancel()
			if err != nil {
				t.Fatalf("retry %d: %v", retries, err)
			}

			if kind == "jetstream" {
				// The retry stored nothing again: every message once,
				// none lost, judged from the stream itself.
				streamHoldsOnce(t, r, append(msgs, warm), fmt.Sprintf("after %d retries", retries))
				r.noDuplicates = true
			}

			stats := &idempotency.Stats{}
			r.finish(2, stats)
			r.check(stats)
			dups := stats.Snapshot().DuplicatesSuppressed
			t.Logf("%s: %d jobs published twice (answer lost, retried), %d duplicates suppressed, %+v", kind, n, dups, stats.Snapshot())
			if kind == "jetstream" {
				// Deduplicated by the server: no transport duplicate for
				// the guard (check asserted 0 suppressed).
				return
			}
			// RabbitMQ and PostgreSQL receive all n before the answer is
			// held; SQS sends batches of ten one after the other, so only
			// the first reached it.
			if dups == 0 || dups > n {
				t.Errorf("%d duplicates suppressed, want 1..%d transport duplicates: the lost answer did not leave the first publish on the broker", dups, n)
			}
		})
	}
}

// streamHoldsOnce asserts from the server's state that the stream of r's
// JetStream queue holds each of want exactly once and nothing else but the
// two poison jobs: the messages are read one by one, by sequence, through
// r's broker's own connection (not the proxied publisher's), and counted by
// their berth message ID.
func streamHoldsOnce(t *testing.T, r *billingRun, want []*sdk.Message, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := r.broker.(*jetstream.Broker)
	js, err := njs.New(b.Conn())
	if err != nil {
		t.Fatal(err)
	}
	name, _ := b.StreamNames(r.queue)
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	var stored uint64
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, njs.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		stored++
		// berth's envelope (the Berth-Message header) carries the
		// message ID; Nats-Msg-Id is what the server deduplicates by.
		var env struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(m.Header.Get("Berth-Message")), &env); err != nil {
			t.Fatalf("%s: message %d: berth envelope: %v", when, seq, err)
		}
		count[env.ID]++
	}
	if stored != info.State.Msgs {
		t.Errorf("%s: read %d messages, the stream reports %d", when, stored, info.State.Msgs)
	}
	once := 0
	for _, m := range want {
		if c := count[m.ID]; c == 1 {
			once++
		} else {
			t.Errorf("%s: message %s (%s) stored %d times, want once", when, m.ID, m.IdempotencyKey, c)
		}
	}
	if extra := int(stored) - len(want) - 2; extra != 0 {
		t.Errorf("%s: the stream holds %d messages, want %d (%d published once, 2 poison jobs): %v", when, stored, len(want)+2, len(want), count)
	}
	t.Logf("jetstream %s: stream %s holds %d messages (sequences %d–%d); %d of the %d published stored once", when, name, stored, info.State.FirstSeq, info.State.LastSeq, once, len(want))
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
	case "jetstream":
		b, err := jetstream.Connect(ctx, via(r.ep.nats), jetstream.ConnectOptions{Name: "berth-lost-confirm", ReconnectWait: 100 * time.Millisecond},
			jetstream.Options{AckWait: e2eLease})
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
