package memory_test

import (
	"context"
	"fmt"
	"log"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

func Example() {
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	err = b.Publish(ctx, "billing", &sdk.Message{
		Type:           "billing.charge",
		IdempotencyKey: "charge:order_123:v1",
		Body:           []byte(`{"order":"order_123","cents":4200}`),
	})
	if err != nil {
		log.Fatal(err)
	}

	ds, err := b.Receive(ctx, "billing", 10)
	if err != nil {
		log.Fatal(err)
	}
	d := ds[0]
	fmt.Println(d.Message().Type, d.Message().IdempotencyKey, d.Attempt())
	fmt.Println(string(d.Message().Body))
	if err := d.Ack(ctx); err != nil {
		log.Fatal(err)
	}

	s, err := b.Stats(ctx, "billing")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("ready=%d in-flight=%d dead=%d\n", s.Ready, s.InFlight, s.DeadLettered)
	// Output:
	// billing.charge charge:order_123:v1 1
	// {"order":"order_123","cents":4200}
	// ready=0 in-flight=0 dead=0
}

// A handler's permanent failure dead-letters the job; an operator redrives
// it once the cause is fixed.
func ExampleBroker_RedriveDeadLetters() {
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	if err := b.Publish(ctx, "emails", &sdk.Message{Type: "email.welcome", Body: []byte("user_456")}); err != nil {
		log.Fatal(err)
	}
	ds, _ := b.Receive(ctx, "emails", 1)
	_ = ds[0].DeadLetter(ctx, sdk.Permanent(fmt.Errorf("template missing")))

	dead, _ := b.ListDeadLetters(ctx, "emails", 10)
	fmt.Println(dead[0].Header(sdk.HeaderDeadLetterReason), dead[0].Header(sdk.HeaderDeadLetterClass))

	n, _ := b.RedriveDeadLetters(ctx, "emails")
	ds, _ = b.Receive(ctx, "emails", 1)
	fmt.Println(n, ds[0].Attempt(), ds[0].Message().Header(sdk.HeaderRedriveCount))
	_ = ds[0].Ack(ctx)
	// Output:
	// permanent: template missing permanent
	// 1 1 1
}
