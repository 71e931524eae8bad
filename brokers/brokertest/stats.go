package brokertest

import (
	"errors"
	"testing"

	"github.com/berthq/berth/sdk"
)

// testStatsUnknownQueue: Stats of a queue that was never declared nor used
// fails with an error wrapping sdk.ErrNotFound on every broker, instead of
// zero counts on some (which hide a misspelt queue name behind "empty") and
// an error on others. On brokers that create queues on first use, a
// Publish makes the queue known, and Stats then counts its message.
func testStatsUnknownQueue(t *testing.T, e *env) {
	in, ok := e.b.(sdk.Inspector)
	if !ok {
		t.Skipf("%T does not implement sdk.Inspector", e.b)
	}
	ctx := e.ctx(t)
	q := undeclaredQueue(t, e.b)
	if s, err := in.Stats(ctx, q); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Stats(%s) of a queue never declared nor used = %+v, %v; want ErrNotFound", q, s, err)
	}
	if e.h.Undeclared != UndeclaredCreated {
		return
	}
	if err := e.b.Publish(ctx, q, textMessage("stats-unknown")); err != nil {
		t.Fatalf("Publish to %s: %v", q, err)
	}
	s, err := in.Stats(ctx, q)
	if err != nil || s.Ready+s.Delayed != 1 {
		t.Errorf("Stats(%s) after a Publish = %+v, %v; want the message counted", q, s, err)
	}
}
