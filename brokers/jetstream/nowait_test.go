package jetstream_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// endingCtx is a context that ends once Receive's pull has its first
// message: the first Done channel it hands out never closes, the later ones
// are closed (a select calls Done every time it runs). Receive's pull thus
// finds ctx ended while the rest of its no_wait answer is arriving (a
// Worker's shutdown at that moment).
type endingCtx struct {
	context.Context
	open, closed chan struct{}
	calls        atomic.Int32
}

func newEndingCtx(parent context.Context) *endingCtx {
	c := &endingCtx{Context: parent, open: make(chan struct{}), closed: make(chan struct{})}
	close(c.closed)
	return c
}

func (c *endingCtx) Done() <-chan struct{} {
	if c.calls.Add(1) == 1 {
		return c.open
	}
	return c.closed
}

func (c *endingCtx) Err() error {
	if c.calls.Load() < 2 {
		return nil
	}
	return context.Canceled
}

// A Receive whose ctx ends while its no_wait pull is answered gives back
// what the server still delivers to it, without consuming an attempt, as a
// cancelled long poll does. Those messages were dropped: they came back
// only after their AckWait, an attempt spent.
func TestCancelledNoWaitPullGivesBack(t *testing.T) {
	b := newBroker(t, jetstream.Options{AckWait: 20 * time.Second, WaitTime: 700 * time.Millisecond, Logger: quiet})
	q := declare(t, b, "nowaitback")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	msgs := make([]*sdk.Message, 40)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "nowait"}
	}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	// It returns what it read before ctx ended.
	ds, err := b.Receive(newEndingCtx(ctx), q, len(msgs))
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) == len(msgs) {
		t.Fatal("the pull read every message before ctx ended")
	}
	for _, d := range ds {
		got[d.Message().ID] = d.Attempt()
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ackAllAtFirstAttempt(ctx, t, b, q, msgs, got)
}

// ackAllAtFirstAttempt receives and acks from q until every one of msgs was
// seen (got holds those seen already, by ID, with their attempt), for up to
// 8 s, and fails t for each not seen at attempt 1: given back without
// consuming an attempt, well before the stream's AckWait (20 s) would
// bring it back.
func ackAllAtFirstAttempt(ctx context.Context, t *testing.T, b *jetstream.Broker, q string, msgs []*sdk.Message, got map[string]int) {
	t.Helper()
	for deadline := time.Now().Add(8 * time.Second); len(got) < len(msgs) && time.Now().Before(deadline); {
		ds, err := b.Receive(ctx, q, len(msgs))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			got[d.Message().ID] = d.Attempt()
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, m := range msgs {
		if a, ok := got[m.ID]; !ok || a != 1 {
			t.Errorf("message %s: attempt %d (received %t), want attempt 1 well before its AckWait of 20 s", m.ID, a, ok)
		}
	}
}
