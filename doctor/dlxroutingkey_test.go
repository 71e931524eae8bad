package doctor_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
)

// TestRabbitMQDeadLetterRoutingKey: the server dead-letters a queue's
// messages (its delivery limit: a job that kills its workers; a TTL)
// through x-dead-letter-exchange with x-dead-letter-routing-key, and the
// dead-letter exchange routes to <queue>.dlq by the queue's name. A queue
// whose routing key is another name sends them elsewhere: to no queue
// (dropped) or to another queue's dead letters, never to its own, where
// berth lists, syncs and redrives them. Doctor read only that the exchange
// was set, and reported the queue's dead letters OK. Conversely, the
// default exchange "" (set, empty) routes by queue name: with the routing
// key <queue>.dlq it sends them straight there, which doctor reported as
// "no dead-letter exchange", an error.
func TestRabbitMQDeadLetterRoutingKey(t *testing.T) {
	url := integration.RabbitMQURL(t)
	q, straight := "misrouted", "straight"
	conn := rawRabbit(t, url, &q, &straight)
	for _, n := range []string{q, straight} {
		declare(t, conn, rabbitmq.DeadLetterQueue(n), amqp.Table{"x-queue-type": "quorum"})
	}
	declare(t, conn, q, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(9),
		"x-dead-letter-exchange": rabbitmq.DefaultDeadLetterExchange, "x-dead-letter-routing-key": "elsewhere"})
	declare(t, conn, straight, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(9),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": rabbitmq.DeadLetterQueue(straight)})
	b := open(t, url)
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{q, straight}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "rabbitmq.dead-letter-exchange", q, doctor.Error)
	expect(t, fs, "rabbitmq.dead-letter-queue", q, doctor.OK)
	expect(t, fs, "rabbitmq.dead-letter-exchange", straight, doctor.OK)
}
