package telemetry_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// TestPublisherSystemLooksThroughWrappers: the messaging.system of a send
// span is the broker's under the publishing wrappers (the ledger's, an
// AsyncPool, an sdk.LongDelay), not the wrapper's package: before, the
// ledger's wrapper counted every message under "ledger", the pool and a
// LongDelay (the README's way to publish delays past a broker's limit)
// under "sdk".
func TestPublisherSystemLooksThroughWrappers(t *testing.T) {
	tp, rec := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{})
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	l, err := ledger.New(ledger.Options{Store: &ledgerEvents{}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	pool := sdk.NewAsyncPublisher(b, sdk.AsyncOptions{})
	t.Cleanup(func() { _ = pool.Close() })
	poolOfLedger := sdk.NewAsyncPublisher(l.Publisher(b), sdk.AsyncOptions{})
	t.Cleanup(func() { _ = poolOfLedger.Close() })

	for name, p := range map[string]sdk.Publisher{
		"ledger":         l.Publisher(b),
		"pool":           pool,
		"pool-of-ledger": poolOfLedger,
		"long-delay":     sdk.LongDelay{Publisher: b, Limit: time.Hour},
	} {
		queue := "sys-" + name
		if err := obs.Publisher(p).Publish(context.Background(), queue, &sdk.Message{Type: "t"}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		sends := spansNamed(rec, "send "+queue)
		if len(sends) != 1 {
			t.Fatalf("%s: %d send spans, want 1", name, len(sends))
		}
		if got := attrsOf(sends[0])["messaging.system"].AsString(); got != "memory" {
			t.Errorf("%s: messaging.system %q, want %q", name, got, "memory")
		}
	}
}
