package jetstream_test

import (
	"context"
	"log"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// ExampleConnect runs a Worker on a JetStream queue. The example is
// compiled, not run: it needs a server (nats-server -js).
func ExampleConnect() {
	ctx := context.Background()
	b, err := jetstream.Connect(ctx, "nats://127.0.0.1:4222",
		jetstream.ConnectOptions{Name: "billing-worker"}, // TLS, CredentialsFile, NKeyFile, User/Password, Token
		jetstream.Options{AckWait: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	if err := b.DeclareQueue(ctx, "billing"); err != nil { // stream BERTH_Q_billing, its consumers, BERTH_DLQ_billing
		log.Fatal(err)
	}
	msg, err := sdk.NewJSON("billing.charge", map[string]string{"order": "order_123"})
	if err != nil {
		log.Fatal(err)
	}
	msg.IdempotencyKey = "charge:order_123:v1"
	if err := b.Publish(ctx, "billing", msg); err != nil {
		log.Fatal(err)
	}

	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		log.Printf("charging %s (attempt %d)", d.Message().IdempotencyKey, d.Attempt())
		return nil
	}), sdk.WorkerOptions{Queue: "billing", Lease: time.Minute}) // Lease at most AckWait
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
