package rabbitmq_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/sdk"
)

// A broker declares its topology, publishes with confirms and feeds a Worker.
func Example() {
	ctx := context.Background()
	b, err := rabbitmq.New(ctx, "amqp://guest:guest@127.0.0.1:5672/", rabbitmq.Options{
		QueueType:     rabbitmq.Quorum, // the default
		MaxDeliveries: 5,               // a message that kills 5 workers goes to billing.dlq
	})
	if err != nil {
		log.Fatal(err) // the password is not in err
	}
	defer b.Close()
	if err := b.DeclareQueue(ctx, "billing"); err != nil {
		log.Fatal(err)
	}
	m, _ := sdk.NewJSON("billing.charge", map[string]string{"order": "order_123"})
	m.IdempotencyKey = "charge:order_123:v1"
	if err := b.Publish(ctx, "billing", m); err != nil {
		log.Fatal(err)
	}
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		fmt.Println("charging", d.Message().IdempotencyKey, "attempt", d.Attempt())
		return nil
	}), sdk.WorkerOptions{Queue: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	_ = w.Run(ctx)
}

// Errors and logs show URLs with the password masked.
func ExampleRedact() {
	s, _ := rabbitmq.Redact("amqps://app:s3cret@rabbit.internal:5671/prod")
	fmt.Println(s)
	// Output: amqps://app:xxxxx@rabbit.internal:5671/prod
}

// Each main queue has a dead-letter queue and, once used, delay queues named
// after their TTL.
func ExampleDelayQueue() {
	fmt.Println(rabbitmq.DeadLetterQueue("billing"))
	fmt.Println(rabbitmq.DelayQueue("billing", 30*time.Second))
	fmt.Println(rabbitmq.DelayQueue("billing", 250*time.Millisecond))
	// Output:
	// billing.dlq
	// billing.delay.30s
	// billing.delay.250ms
}
