package doctor_test

import (
	"testing"
	"time"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestRabbitMQArgumentsRefused: a login without the configure permission
// (an application's or a monitoring user, which may publish and consume
// but not declare) cannot read a queue's arguments, which takes a
// queue.declare: the server refuses it (403 ACCESS_REFUSED). Doctor
// failed as a whole on the first queue; the queue's checks that need the
// arguments are an Info finding that says why, and the others still run.
func TestRabbitMQArgumentsRefused(t *testing.T) {
	node := integration.StartRabbitMQ(t)
	url := node.User(t, "berthdoctor", "^$", ".*", ".*")
	q, other := "billing", "emails"
	admin := open(t, node.URL)
	for _, n := range []string{q, other} {
		if err := admin.(sdk.QueueDeclarer).DeclareQueue(testCtx(t), n); err != nil {
			t.Fatal(err)
		}
	}
	b := open(t, url+"?no_declare=true")
	fs, err := doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{q, other}})
	if err != nil {
		t.Fatalf("doctor as a login that may not declare: %v", err)
	}
	for _, n := range []string{q, other} {
		expect(t, fs, "rabbitmq.queue-arguments", n, doctor.Info)
	}
	expect(t, fs, "rabbitmq.prefetch", "", doctor.OK)

	// A login that may declare the main queues only: the dead-letter queue
	// and a delay queue exist, their arguments refused.
	if err := admin.Publish(testCtx(t), q, &sdk.Message{Type: "doctor.test", Delay: time.Minute}); err != nil {
		t.Fatal(err)
	}
	b = open(t, node.User(t, "berthdoctormain", "^(billing|emails)$", ".*", ".*")+"?no_declare=true")
	fs, err = doctor.Run(testCtx(t), b, doctor.Options{Queues: []string{q}})
	if err != nil {
		t.Fatalf("doctor as a login that may declare the main queues only: %v", err)
	}
	for _, id := range []string{"rabbitmq.queue-type", "rabbitmq.dead-letter-exchange", "rabbitmq.dead-letter-queue", "rabbitmq.delivery-limit"} {
		expect(t, fs, id, q, doctor.OK)
	}
	expect(t, fs, "rabbitmq.delay-queues", q, doctor.Info)
}
