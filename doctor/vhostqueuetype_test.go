package doctor_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
)

// TestRabbitMQVhostDefaultQueueType: in a vhost whose default queue type
// is quorum (rabbitmqctl add_vhost --default-queue-type quorum), a queue
// declared without x-queue-type (by another tool, a definitions file) is a
// quorum queue, and a redeclare without x-queue-type is equivalent to it:
// the argument probe read none, and doctor reported a quorum queue with a
// delivery limit as "classic queue: no delivery limit" (two warnings).
// A queue declared classic explicitly in that vhost is still classic.
func TestRabbitMQVhostDefaultQueueType(t *testing.T) {
	node := integration.StartRabbitMQ(t)
	node.Ctl(t, "add_vhost", "qq", "--default-queue-type", "quorum")
	node.Ctl(t, "set_permissions", "-p", "qq", "guest", ".*", ".*", ".*")
	url := node.URL + "qq"
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	declare(t, conn, "jobs", amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "jobs.dlq", "x-delivery-limit": int64(10)})
	declare(t, conn, "jobs.dlq", nil)
	declare(t, conn, "legacy", amqp.Table{"x-queue-type": "classic", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "legacy.dlq"})
	declare(t, conn, "legacy.dlq", amqp.Table{"x-queue-type": "classic"})
	b := open(t, url)
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{"jobs", "legacy"}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "rabbitmq.queue-type", "jobs", doctor.OK)
	expect(t, fs, "rabbitmq.delivery-limit", "jobs", doctor.OK)
	expect(t, fs, "rabbitmq.queue-type", "legacy", doctor.Warn)
	expect(t, fs, "rabbitmq.delivery-limit", "legacy", doctor.Warn)
}
