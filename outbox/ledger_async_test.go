package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// countingRabbit counts the synchronous Publish calls made on a RabbitMQ
// broker.
type countingRabbit struct {
	*rabbitmq.Broker
	sync atomic.Int32
}

func (c *countingRabbit) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	c.sync.Add(1)
	return c.Broker.Publish(ctx, queue, msgs...)
}

// events is a ledger Store that keeps what it is given.
type events struct {
	mu  sync.Mutex
	got []ledger.Event
}

func (e *events) Write(_ context.Context, batch []ledger.Event) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, batch...)
	return nil
}

// TestRelayThroughLedgerUsesAsyncPublish: a relay publishing through the
// ledger's publisher fell back to RabbitMQ's synchronous Publish, as the
// wrapper hid PublishAsync. It takes the asynchronous path, and the ledger
// records every confirmed row as enqueued and not the row RabbitMQ refused.
func TestRelayThroughLedgerUsesAsyncPublish(t *testing.T) {
	ctx := context.Background()
	pool, box, _ := setup(t)
	rb, err := rabbitmq.New(ctx, integration.RabbitMQURL(t), rabbitmq.Options{QueueType: rabbitmq.Classic, MaxMessageSize: 1024, MaxInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rb.Close() })
	q := "outbox_ledger_async_" + sdk.NewID()
	if err := rb.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rb.DeleteQueue(context.Background(), q) })
	store := &events{}
	l, err := ledger.New(ledger.Options{Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	b := &countingRabbit{Broker: rb}

	msgs := []*sdk.Message{{Type: "a"}, {Type: "big", Body: make([]byte, 2048)}}
	for range 30 { // more than MaxInFlight: the window slides
		msgs = append(msgs, &sdk.Message{Type: "more"})
	}
	add(t, pool, box, q, msgs...)
	n, err := box.RelayOnce(ctx, l.Publisher(b), fastRelay())
	if n != len(msgs)-1 || !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Fatalf("RelayOnce = %d, %v; want %d published and the refusal reported", n, err, len(msgs)-1)
	}
	if c := b.sync.Load(); c != 0 {
		t.Errorf("%d synchronous Publish calls through the ledger's publisher, want none (PublishAsync)", c)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	seen := map[string]bool{}
	for _, e := range store.got {
		if e.Status != ledger.StatusEnqueued || e.Queue != q {
			t.Errorf("event %+v, want enqueued on %s", e, q)
		}
		seen[e.MessageID] = true
	}
	if len(seen) != len(msgs)-1 {
		t.Errorf("%d messages recorded, want %d", len(seen), len(msgs)-1)
	}
	if seen[msgs[1].ID] {
		t.Error("the refused row was recorded as enqueued")
	}
}
