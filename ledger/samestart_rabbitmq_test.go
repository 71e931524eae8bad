package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// TestLeaseLostTwiceClassicRabbitMQ is TestLeaseLostTwiceSameAttemptRedelivery
// on a real classic queue: each consumer's connection closes with the
// delivery unsettled (its lease lost), and the server delivers it again;
// the second and third deliveries both have attempt 2. Each lost lease is
// reported after the next delivery started, as a Worker whose handler
// outlives its lease reports it. The row shows the delivery running, then
// its success.
func TestLeaseLostTwiceClassicRabbitMQ(t *testing.T) {
	url := integration.RabbitMQURL(t)
	ctx := testCtx(t, 60*time.Second)
	open := func() *rabbitmq.Broker {
		t.Helper()
		b, err := rabbitmq.New(ctx, url, rabbitmq.Options{Logger: quiet, QueueType: rabbitmq.Classic, Prefetch: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	pub := open()
	q := "berth_ledgertest_" + suffix()
	if err := pub.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = pub.DeleteQueue(ctx, q)
	})
	store := newStore(t, newPool(t))
	led := newLedger(t, store, ledger.Options{Linger: -1})
	m := &sdk.Message{Type: "ledger.classic", Body: []byte(`{}`)}
	if err := led.Publisher(pub).Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	type run struct {
		b    *rabbitmq.Broker
		d    sdk.Delivery
		hctx context.Context
	}
	start := func() run {
		t.Helper()
		b := open()
		ds, err := b.Receive(ctx, q, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Receive: %d deliveries, %v", len(ds), err)
		}
		return run{b: b, d: ds[0], hctx: led.Start(ctx, ds[0])}
	}
	lose := func(r run) {
		t.Helper()
		if err := r.b.Close(); err != nil { // the unsettled delivery goes back
			t.Fatal(err)
		}
	}
	first := start()
	lose(first)
	second := start()
	lose(second)
	third := start()
	if a2, a3 := second.d.Attempt(), third.d.Attempt(); a2 != 2 || a3 != 2 {
		t.Fatalf("attempts %d, %d after two lost leases on a classic queue; the test expects 2 and 2 (the redelivered flag only)", a2, a3)
	}
	// The lost leases, reported late.
	for _, r := range []run{first, second} {
		led.Settled(r.hctx, r.d, sdk.Settlement{Action: sdk.ActionLeaseLost, Duration: time.Millisecond})
	}
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	j, err := store.Job(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != ledger.StatusRunning || j.Attempts != 2 {
		t.Fatalf("row %s at attempt %d (class %s); want running at attempt 2: the third delivery runs", j.Status, j.Attempts, j.ErrorClass)
	}
	if err := third.d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	led.Settled(third.hctx, third.d, sdk.Settlement{Action: sdk.ActionAck, Duration: time.Millisecond})
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if j, err := store.Job(ctx, m.ID); err != nil || j.Status != ledger.StatusSucceeded || j.Attempts != 2 {
		t.Fatalf("after the ack: %+v, %v; want succeeded at attempt 2", j, err)
	}
}
