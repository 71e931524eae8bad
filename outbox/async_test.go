package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// The relay publishes through a broker's asynchronous publish when it has
// one: every row of a pass is in flight at once, and a row the broker
// refuses fails alone. Checked with the generic pool over the memory broker
// and with RabbitMQ's native PublishAsync.
func TestRelayUsesAsyncPublish(t *testing.T) {
	ctx := context.Background()
	t.Run("pool", func(t *testing.T) {
		pool, box, _ := setup(t)
		b, err := memory.New(memory.Options{MaxMessageSize: 1024})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		ap := sdk.NewAsyncPublisher(b, sdk.AsyncOptions{})
		t.Cleanup(func() { _ = ap.Close() })
		msgs := []*sdk.Message{{Type: "a"}, {Type: "big", Body: make([]byte, 2048)}, {Type: "b"}}
		for range 50 {
			msgs = append(msgs, &sdk.Message{Type: "more"})
		}
		add(t, pool, box, "q", msgs...)
		n, err := box.RelayOnce(ctx, ap, fastRelay())
		if n != len(msgs)-1 || !errors.Is(err, sdk.ErrMessageTooLarge) {
			t.Fatalf("RelayOnce = %d, %v; want %d published and the refusal reported", n, err, len(msgs)-1)
		}
		got := drain(t, b, "q", len(msgs)-1)
		if got[msgs[1].ID] != nil {
			t.Error("the oversized row was published")
		}
	})
	t.Run("rabbitmq", func(t *testing.T) {
		pool, box, _ := setup(t)
		b, err := rabbitmq.New(ctx, integration.RabbitMQURL(t), rabbitmq.Options{QueueType: rabbitmq.Classic, MaxMessageSize: 1024, MaxInFlight: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		q := "outbox_async_" + sdk.NewID()
		if err := b.DeclareQueue(ctx, q); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.DeleteQueue(context.Background(), q) })
		msgs := []*sdk.Message{{Type: "a"}, {Type: "big", Body: make([]byte, 2048)}}
		for range 50 { // more than MaxInFlight: the window slides
			msgs = append(msgs, &sdk.Message{Type: "more"})
		}
		add(t, pool, box, q, msgs...)
		n, err := box.RelayOnce(ctx, b, fastRelay())
		if n != len(msgs)-1 || !errors.Is(err, sdk.ErrMessageTooLarge) {
			t.Fatalf("RelayOnce = %d, %v; want %d published and the refusal reported", n, err, len(msgs)-1)
		}
		seen := map[string]bool{}
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		for len(seen) < len(msgs)-1 {
			ds, err := b.Receive(rctx, q, 100)
			if err != nil {
				t.Fatalf("received %d of %d: %v", len(seen), len(msgs)-1, err)
			}
			for _, d := range ds {
				if seen[d.Message().ID] || d.Message().ID == msgs[1].ID {
					t.Errorf("message %s delivered twice or refused yet delivered", d.Message().ID)
				}
				seen[d.Message().ID] = true
				_ = d.Ack(rctx)
			}
		}
	})
}

func fastRelay() outbox.RelayOptions {
	return outbox.RelayOptions{Backoff: sdk.Backoff{Base: time.Hour, Max: time.Hour}, MaxAttempts: 3}
}
