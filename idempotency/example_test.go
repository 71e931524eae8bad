package idempotency_test

import (
	"context"
	"fmt"
	"log"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/sdk"
)

// A job published twice charges the order once: the second delivery finds the
// key completed and is acked without running the handler.
func Example() {
	var stats idempotency.Stats
	guard, err := idempotency.Middleware(idempotency.Options{
		Store: memstore.New(memstore.Options{}), // pgstore.New(pool, …) in production
		Stats: &stats,
	})
	if err != nil {
		log.Fatal(err)
	}
	charge := guard(sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		key, _ := idempotency.KeyFrom(ctx)
		fmt.Println("charging", key)
		idempotency.SetResult(ctx, idempotency.Result{ResourceType: "order", ResourceID: "order_123"})
		return nil
	}))
	msg := &sdk.Message{ID: sdk.NewID(), Type: "billing.charge", IdempotencyKey: "charge:order_123:v1", Body: []byte(`{"cents":4200}`)}
	for range 2 {
		if err := charge.Handle(context.Background(), berthtest.NewDelivery(msg)); err != nil {
			log.Fatal(err)
		}
	}
	s := stats.Snapshot()
	fmt.Println("executed:", s.Executed, "duplicates suppressed:", s.DuplicatesSuppressed)
	// Output:
	// charging charge:order_123:v1
	// executed: 1 duplicates suppressed: 1
}

// An inbox applies each external event once, however often the sender
// delivers it.
func ExampleInbox() {
	g, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{})})
	if err != nil {
		log.Fatal(err)
	}
	in := g.Inbox()
	ev := idempotency.InboxEvent{Source: "stripe", ID: "evt_42", Type: "charge.refunded", Payload: []byte(`{"amount":500}`)}
	for range 2 {
		processed, err := in.Process(context.Background(), ev, func(ctx context.Context) error {
			fmt.Println("refund recorded")
			return nil
		})
		fmt.Println(processed, err)
	}
	// Output:
	// refund recorded
	// true <nil>
	// false <nil>
}
