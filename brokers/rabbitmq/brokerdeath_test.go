package rabbitmq

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// TestBrokerDeathAttemptsNotFromDeadLetterCount: a message the server
// dead-lettered at the delivery limit reaches the dead-letter queue with
// x-delivery-count counting its deliveries from the dead-letter queue (0,
// then 1 once a walk's channel died with it), not from the main queue
// (RabbitMQ 3.10: a message delivered three times in the main queue arrives
// with x-delivery-count 0). That count is no attempt of the job: the
// listing must not report it as the attempt it was dead-lettered at.
func TestBrokerDeathAttemptsNotFromDeadLetterCount(t *testing.T) {
	h := amqp.Table{
		"x-death": []any{amqp.Table{
			"count": int64(1), "exchange": "", "queue": "jobs", "reason": "delivery_limit",
			"routing-keys": []any{"jobs"}, "time": time.Unix(1_800_000_000, 0),
		}},
		"x-delivery-count": int64(1), // the dead-letter queue's redelivery of this letter
		"berth-attempt":    "3",
	}
	dec := decode(h, "id-1", "t", "", nil)
	annotateBrokerDeath(dec.msg, h, "jobs")
	m := dec.msg
	if got := m.Header(sdk.HeaderDeadLetterQueue); got != "jobs" {
		t.Fatalf("dead-letter queue header %q, want jobs", got)
	}
	if got := m.Header(sdk.HeaderDeadLetterClass); got != string(sdk.ClassPoison) {
		t.Fatalf("class %q, want %q", got, sdk.ClassPoison)
	}
	if got, ok := m.Headers[sdk.HeaderDeadLetterAttempts]; ok {
		t.Fatalf("attempts header %q taken from the dead-letter queue's own delivery count, want none (unknown)", got)
	}
}
