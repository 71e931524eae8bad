package doctor_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
)

// TestRabbitMQDeadLetterExchangeMissing: a queue whose
// x-dead-letter-exchange names an exchange that does not exist (a typo in
// a hand-made declaration, or a dead-letter exchange deleted since) has
// every message the server dead-letters dropped: RabbitMQ routes it to no
// exchange and says nothing. Doctor read only the argument and reported
// "dead letters go to exchange ...", OK, with <queue>.dlq existing.
func TestRabbitMQDeadLetterExchangeMissing(t *testing.T) {
	url := integration.RabbitMQURL(t)
	q := "nodlx"
	conn := rawRabbit(t, url, &q)
	dlx := q + ".no-such-exchange"
	declare(t, conn, rabbitmq.DeadLetterQueue(q), amqp.Table{"x-queue-type": "quorum"})
	declare(t, conn, q, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(9),
		"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": q})
	b := open(t, url)
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{q}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "rabbitmq.dead-letter-exchange", q, doctor.Error)
	expect(t, fs, "rabbitmq.dead-letter-queue", q, doctor.OK)
}
