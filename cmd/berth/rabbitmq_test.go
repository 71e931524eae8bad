package main

import (
	"context"

	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// TestOnRabbitMQ drives the CLI on a broker without the paging and listing
// capabilities: the dead letters are read in one scan, a filtered redrive
// or purge names their IDs, and stats needs its queues named.
func TestOnRabbitMQ(t *testing.T) {
	ctx := context.Background()
	b, u, queue := rabbitQueue(t, ctx, "berth-cli-test")
	var ids []string
	for i := range 5 {
		m := &sdk.Message{Type: "billing.charge", Body: fmt.Appendf(nil, `{"n":%d}`, i)}
		if err := b.Publish(ctx, queue, m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}
	for got := 0; got < 5; {
		ds, err := b.Receive(ctx, queue, 5-got)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			var n int
			fmt.Sscanf(string(d.Message().Body), `{"n":%d}`, &n)
			cause := sdk.Permanent(fmt.Errorf("card %d declined", n))
			if n%2 == 0 {
				cause = fmt.Errorf("timeout %d", n)
			}
			if err := d.DeadLetter(ctx, cause); err != nil {
				t.Fatal(err)
			}
			got++
		}
	}
	b.Close() // its consumer would take the redriven messages
	r := cliOn(t, u, "dlq", "list", queue, "-class", "transient")
	if r.code != 0 || !strings.Contains(r.out, "of 3 matching (5 in the dead-letter queue") {
		t.Fatalf("list (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if r := cliOn(t, u, "stats"); r.code != exitUsage || !strings.Contains(r.err, "name them") {
		t.Fatalf("stats of every queue on RabbitMQ: %d %s", r.code, r.err)
	}
	if r := cliOn(t, u, "dlq", "redrive", queue, "-reason", "timeout", "-yes"); r.code != 0 || !strings.Contains(r.out, "redriven 3 ") {
		t.Fatalf("redrive (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	// RabbitMQ's counts follow the redrive's confirms a moment later.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r = cliOn(t, u, "-json", "stats", queue)
		if r.code == 0 && strings.Contains(r.out, `"ready":3`) && strings.Contains(r.out, `"dead_lettered":2`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats after redrive (exit %d):\n%s%s", r.code, r.out, r.err)
		}
	}
	// Chosen by ID in one sweep: the one found is redriven, the unknown
	// one reported.
	if r := cliOn(t, u, "dlq", "redrive", queue, ids[1], "no-such-id", "-yes"); r.code != exitPartial ||
		!strings.Contains(r.out, "redriven 1 ") || !strings.Contains(r.out, "no-such-id") {
		t.Fatalf("redrive by ID (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if r := cliOn(t, u, "dlq", "purge", queue, "-reason", "card 3 ", "-yes"); r.code != 0 || !strings.Contains(r.out, "purged 1 ") {
		t.Fatalf("filtered purge on RabbitMQ (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if r := cliOn(t, u, "dlq", "purge", queue, "-yes"); r.code != exitNotFound || !strings.Contains(r.out, "purged 0 ") {
		t.Fatalf("purge all (exit %d):\n%s%s", r.code, r.out, r.err)
	}
}

var _ dlq.Sweeper = (*rabbitmq.Broker)(nil)

// TestOnRabbitMQBeyondTenThousand: on RabbitMQ, a filtered listing and a
// filtered redrive go through more than 10,000 dead letters in one
// bounded-memory sweep each, say they are complete, and leave exactly the
// letters not chosen. Before, every walk
// read at most 10,000 (the scan limit of a broker that cannot page) and
// reported complete:false, and a filtered redrive left the rest behind.
func TestOnRabbitMQBeyondTenThousand(t *testing.T) {
	const n = 10050
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	u := integration.RabbitMQURL(t)
	queue := fmt.Sprintf("berth-cli-test-%d", rand.Uint64()%1e12)
	b, err := rabbitmq.New(ctx, u, rabbitmq.Options{ConnectionName: "berth-cli-test"})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_, _ = ch.QueueDelete(rabbitmq.DeadLetterQueue(queue), false, false, false)
		}
		conn.Close()
	})
	if err := b.DeclareQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	b.Close()
	// Dead letters written straight to the dead-letter queue, as the
	// server's own dead-lettering would: half of type a, half of type b.
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
	for i := range n {
		err := ch.PublishWithContext(ctx, "", rabbitmq.DeadLetterQueue(queue), false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("m%05d", i), Type: []string{"a", "b"}[i%2], DeliveryMode: amqp.Persistent, Body: []byte("{}"),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if c := <-confirms; !c.Ack {
			t.Fatalf("publish %d not confirmed", c.DeliveryTag)
		}
	}
	_ = ch.Close()

	r := cliOn(t, u, "-json", "dlq", "list", queue, "-type", "a", "-limit", "3")
	if r.code != 0 || !strings.Contains(r.out, fmt.Sprintf(`"matched":%d`, n/2)) || !strings.Contains(r.out, `"complete":true`) {
		t.Fatalf("list of type a (exit %d):\n%.600s%s", r.code, r.out, r.err)
	}
	r = cliOn(t, u, "-json", "dlq", "redrive", queue, "-type", "a", "-yes")
	if r.code != 0 || !strings.Contains(r.out, fmt.Sprintf(`"done":%d`, n/2)) || !strings.Contains(r.out, `"complete":true`) {
		t.Fatalf("redrive of type a (exit %d):\n%.600s%s", r.code, r.out, r.err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r = cliOn(t, u, "-json", "stats", queue)
		if r.code == 0 && strings.Contains(r.out, fmt.Sprintf(`"ready":%d`, n/2)) && strings.Contains(r.out, fmt.Sprintf(`"dead_lettered":%d`, n-n/2)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats after redrive (exit %d):\n%s%s", r.code, r.out, r.err)
		}
	}
}

// rabbitQueue connects to the test RabbitMQ and declares a new queue named
// prefix-<random>. When the test ends the broker is closed and the queue
// and its dead-letter queue are deleted.
func rabbitQueue(t *testing.T, ctx context.Context, prefix string) (b *rabbitmq.Broker, u, queue string) {
	t.Helper()
	u = integration.RabbitMQURL(t)
	queue = fmt.Sprintf("%s-%d", prefix, rand.Uint64()%1e12)
	b, err := rabbitmq.New(ctx, u, rabbitmq.Options{ConnectionName: "berth-cli-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		if conn, err := amqp.Dial(u); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(queue, false, false, false)
				_, _ = ch.QueueDelete(rabbitmq.DeadLetterQueue(queue), false, false, false)
			}
			conn.Close()
		}
	})
	if err := b.DeclareQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	return b, u, queue
}
