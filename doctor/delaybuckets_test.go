package doctor_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
)

// TestRabbitMQCustomDelayBuckets: a broker made with its own delay buckets
// (rabbitmq.Options.DelayBuckets) retries through their delay queues, not
// the default ones. Doctor checked the default buckets' queues only: a
// custom bucket's delay queue that routes retries elsewhere was reported as
// "no delay queue yet" (info), not an error.
func TestRabbitMQCustomDelayBuckets(t *testing.T) {
	url := integration.RabbitMQURL(t)
	q := "buckets"
	conn := rawRabbit(t, url, &q)
	buckets := []time.Duration{3 * time.Second, 45 * time.Second}
	b, err := rabbitmq.New(testCtx(t), url, rabbitmq.Options{DelayBuckets: buckets})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.DeclareQueue(testCtx(t), q); err != nil {
		t.Fatal(err)
	}
	wrong := rabbitmq.DelayQueue(q, 3*time.Second)
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(wrong, false, false, false)
			_ = ch.Close()
		}
	})
	declare(t, conn, wrong, amqp.Table{"x-queue-type": "quorum", "x-message-ttl": int64(3000),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "elsewhere"})
	fs, err := doctor.RabbitMQ(testCtx(t), b, doctor.Options{Queues: []string{q}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "rabbitmq.delay-queues", q, doctor.Error)
}
