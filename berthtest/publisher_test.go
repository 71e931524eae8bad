package berthtest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

func TestAsyncPublisher(t *testing.T) {
	ctx := context.Background()
	p := berthtest.NewAsyncPublisher()
	var rs []*sdk.PublishResult
	for _, id := range []string{"a", "b", "a"} {
		r, err := p.PublishAsync(ctx, "q", &sdk.Message{ID: id, Headers: map[string]string{"k": id}})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	if got := p.Pending(); !slices.Equal(got, []string{"a", "b", "a"}) {
		t.Errorf("Pending %v, want [a b a]", got)
	}
	for _, r := range rs {
		select {
		case <-r.Done():
			t.Fatalf("%s resolved before the test resolved it", r.ID())
		default:
		}
	}
	// The oldest pending result of an ID resolves first.
	refused := errors.New("refused")
	if !p.Resolve("a", refused) || !p.Resolve("b", nil) {
		t.Fatal("Resolve of a pending message reported false")
	}
	if err := rs[0].Err(); !errors.Is(err, refused) {
		t.Errorf("first a: %v, want refused", err)
	}
	if err := rs[1].Err(); err != nil {
		t.Errorf("b: %v, want confirmed", err)
	}
	if rs[2].Err() != nil || p.Resolve("b", nil) || p.Resolve("missing", nil) {
		t.Error("a result resolved that was not pending")
	}
	if got := p.Pending(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Pending %v, want [a]", got)
	}

	// A copy of the message as handed over, unaffected by later changes.
	m := &sdk.Message{ID: "c", Headers: map[string]string{"k": "before"}}
	p.ResolveAtOnce(func(m *sdk.Message) error {
		if m.Type == "bad" {
			return refused
		}
		return nil
	})
	r, err := p.PublishAsync(ctx, "q", m)
	if err != nil || r.Err() != nil {
		t.Fatalf("resolved at once: %v, %v", err, r.Err())
	}
	m.Headers["k"] = "after"
	if got := p.Message("c"); got == nil || got.Header("k") != "before" || got.CorrelationID != "c" {
		t.Errorf("Message(c) = %+v, want the prepared copy as handed over", got)
	}
	if r, _ := p.PublishAsync(ctx, "q", &sdk.Message{Type: "bad"}); !errors.Is(r.Err(), refused) {
		t.Errorf("at once with fn's error: %v", r.Err())
	}
	if p.Message("nope") != nil {
		t.Error("Message of an unpublished ID is not nil")
	}

	// Invalid input is refused as a broker refuses it, and counts nowhere.
	if _, err := p.PublishAsync(ctx, "bad queue!", &sdk.Message{}); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("bad queue: %v, want ErrInvalidQueue", err)
	}
	if p.SyncCalls() != 0 {
		t.Errorf("SyncCalls %d before any Publish", p.SyncCalls())
	}
	if err := p.Publish(ctx, "q", &sdk.Message{ID: "s1"}, &sdk.Message{ID: "s2"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(ctx, "q", nil); err == nil {
		t.Error("Publish of a nil message succeeded")
	}
	if p.SyncCalls() != 1 || p.Message("s2") == nil {
		t.Errorf("SyncCalls %d, Message(s2) %v: want 1 and the message", p.SyncCalls(), p.Message("s2"))
	}
}

// Code that publishes asynchronously, tested on confirm and on failure
// without a broker: here an sdk.AsyncPool, as an outbox relay would use.
func ExampleAsyncPublisher() {
	broker := berthtest.NewAsyncPublisher()
	pool := sdk.NewAsyncPublisher(broker, sdk.AsyncOptions{})
	defer pool.Close()

	ctx := context.Background()
	paid, _ := pool.PublishAsync(ctx, "billing", &sdk.Message{ID: "order-1", Type: "order.paid"})
	lost, _ := pool.PublishAsync(ctx, "billing", &sdk.Message{ID: "order-2", Type: "order.paid"})
	fmt.Println("unconfirmed:", broker.Pending())

	broker.Resolve("order-1", nil)
	broker.Resolve("order-2", sdk.ErrUnavailable)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	fmt.Println("order-1:", paid.Wait(wctx))
	fmt.Println("order-2:", lost.Wait(wctx))
	fmt.Println("synchronous calls:", broker.SyncCalls())
	// Output:
	// unconfirmed: [order-1 order-2]
	// order-1: <nil>
	// order-2: berth: broker unavailable
	// synchronous calls: 0
}

// TestAsyncPublisherCancelledContext: with ctx already done, a broker
// publishes nothing and returns ctx.Err() (sdk.AsyncPublisher, and every
// broker's Publish); the fake must not accept the message.
func TestAsyncPublisherCancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p := berthtest.NewAsyncPublisher()
	r, err := p.PublishAsync(ctx, "q", &sdk.Message{ID: "a"})
	if !errors.Is(err, context.Canceled) || r != nil {
		t.Errorf("PublishAsync with a cancelled ctx = %v, %v; want nil, context.Canceled", r, err)
	}
	if err := p.Publish(ctx, "q", &sdk.Message{ID: "b"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Publish with a cancelled ctx = %v; want context.Canceled", err)
	}
	if got := p.Pending(); len(got) != 0 {
		t.Errorf("Pending %v, want none", got)
	}
	if p.Message("a") != nil || p.Message("b") != nil || p.SyncCalls() != 0 {
		t.Errorf("a message was recorded as published (sync calls %d)", p.SyncCalls())
	}
}
