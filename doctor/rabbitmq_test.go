package doctor_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// rawRabbit returns a plain AMQP connection and a queue-name prefix; every
// queue starting with it that the test names is deleted when it ends.
func rawRabbit(t *testing.T, url string, names ...*string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	p := "berth_doctor_" + suffix() + "_"
	for _, n := range names {
		*n = p + *n
	}
	t.Cleanup(func() {
		defer conn.Close()
		for _, n := range names {
			all := []string{*n, rabbitmq.DeadLetterQueue(*n)}
			for _, ttl := range rabbitmq.DefaultDelayBuckets {
				all = append(all, rabbitmq.DelayQueue(*n, ttl))
			}
			for _, q := range all {
				ch, err := conn.Channel()
				if err != nil {
					return
				}
				_, _ = ch.QueueDelete(q, false, false, false)
				_ = ch.Close()
			}
		}
	})
	return conn
}

func declare(t *testing.T, conn *amqp.Connection, name string, args amqp.Table) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
}

func TestRabbitMQDefaultsPass(t *testing.T) {
	url := integration.RabbitMQURL(t)
	q := "billing"
	rawRabbit(t, url, &q)
	b := open(t, url)
	if err := b.(sdk.QueueDeclarer).DeclareQueue(testCtx(t), q); err != nil {
		t.Fatal(err)
	}
	// A delayed publish declares one delay queue.
	if err := b.Publish(testCtx(t), q, &sdk.Message{Type: "doctor.test", Delay: time.Minute}); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{q}})
	if err != nil {
		t.Fatal(err)
	}
	clean(t, fs)
	for _, id := range []string{"rabbitmq.queue-type", "rabbitmq.dead-letter-exchange", "rabbitmq.dead-letter-queue",
		"rabbitmq.delivery-limit", "rabbitmq.delay-queues"} {
		expect(t, fs, id, q, doctor.OK)
	}
	expect(t, fs, "rabbitmq.consumer-timeout", q, doctor.Info) // not visible over AMQP
	expect(t, fs, "rabbitmq.prefetch", "", doctor.OK)
	expect(t, fs, sdk.ConflictMaxAttemptsOverCap, "", doctor.OK)
}

func TestRabbitMQMisconfigured(t *testing.T) {
	url := integration.RabbitMQURL(t)
	classic, nolimit, missing, badDelay := "classic", "nolimit", "missing", "baddelay"
	conn := rawRabbit(t, url, &classic, &nolimit, &missing, &badDelay)
	declare(t, conn, classic, nil) // a classic queue, no DLX, no DLQ
	declare(t, conn, nolimit, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "berth.dlx", "x-dead-letter-routing-key": nolimit})
	declare(t, conn, rabbitmq.DeadLetterQueue(nolimit), amqp.Table{"x-queue-type": "quorum"})
	b := open(t, url)
	if err := b.(sdk.QueueDeclarer).DeclareQueue(testCtx(t), badDelay); err != nil {
		t.Fatal(err)
	}
	// a delay queue that dead-letters to the wrong queue
	declare(t, conn, rabbitmq.DelayQueue(badDelay, time.Second), amqp.Table{"x-queue-type": "quorum", "x-message-ttl": int64(1000),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "elsewhere"})

	fs, err := doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{classic, nolimit, missing, badDelay},
		LongestJob: 2 * time.Hour, Prefetch: 200, Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "rabbitmq.queue-type", classic, doctor.Warn)
	expect(t, fs, "rabbitmq.dead-letter-exchange", classic, doctor.Error)
	expect(t, fs, "rabbitmq.dead-letter-queue", classic, doctor.Error)
	expect(t, fs, "rabbitmq.delivery-limit", classic, doctor.Warn)
	expect(t, fs, "rabbitmq.queue-type", nolimit, doctor.OK)
	expect(t, fs, "rabbitmq.delivery-limit", nolimit, doctor.Error)
	expect(t, fs, "rabbitmq.dead-letter-queue", nolimit, doctor.OK)
	expect(t, fs, "rabbitmq.queue-missing", missing, doctor.Error)
	expect(t, fs, "rabbitmq.delay-queues", badDelay, doctor.Error)
	expect(t, fs, "rabbitmq.consumer-timeout", badDelay, doctor.Warn) // a 2 h job, a timeout nobody can see
	expect(t, fs, "rabbitmq.prefetch", "", doctor.Warn)

	fs, err = doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{badDelay}, Prefetch: 2})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "rabbitmq.prefetch", "", doctor.Warn)
	if _, err := doctor.Run(testCtx(t), b, doctor.Options{}); err == nil {
		t.Error("Run on RabbitMQ without queues: no error")
	}
}

// TestRabbitMQDelayQueueToDeadLetterExchange: a delay queue must dead-letter
// its expired retries through the default exchange ("") to the queue. One
// whose x-dead-letter-exchange is the dead-letter exchange, with the queue's
// name as routing key, sends every retry to <queue>.dlq when its delay ends:
// no job is ever retried. Doctor reported it OK, as it checked only that an
// x-dead-letter-exchange was present.
func TestRabbitMQDelayQueueToDeadLetterExchange(t *testing.T) {
	url := integration.RabbitMQURL(t)
	q := "dlxdelay"
	conn := rawRabbit(t, url, &q)
	b := open(t, url)
	ctx := testCtx(t)
	if err := b.(sdk.QueueDeclarer).DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	delay := rabbitmq.DelayQueue(q, time.Second)
	declare(t, conn, delay, amqp.Table{"x-queue-type": "quorum", "x-message-ttl": int64(1000),
		"x-dead-letter-exchange": rabbitmq.DefaultDeadLetterExchange, "x-dead-letter-routing-key": q})

	// On the server, a retry in that delay queue ends in the dead-letter queue.
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.PublishWithContext(ctx, "", delay, true, false, amqp.Publishing{Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	dlq := rabbitmq.DeadLetterQueue(q)
	for {
		st, err := ch.QueueDeclarePassive(dlq, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st.Messages == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the retry never reached %s: %d messages", dlq, st.Messages)
		case <-time.After(50 * time.Millisecond):
		}
	}

	fs, err := doctor.Run(ctx, b, doctor.Options{Queues: []string{q}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "rabbitmq.delay-queues", q, doctor.Error)
}
