package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// resolve resolves the pending result of id on the test's broker.
func resolve(t *testing.T, b *berthtest.AsyncPublisher, id string, err error) {
	t.Helper()
	if !b.Resolve(id, err) {
		t.Fatalf("%s is not pending on the broker", id)
	}
}

// TestPublisherKeepsAsyncPublish: the ledger's publisher hid the broker's
// PublishAsync, so the outbox relay and sdk.NewAsyncPublisher fell back to
// the synchronous path through it. It is an sdk.AsyncPublisher exactly
// when the wrapped publisher is; it records a message when the broker
// confirms it (before its result resolves), never one the broker failed,
// and hands back the broker's outcome.
func TestPublisherKeepsAsyncPublish(t *testing.T) {
	c := &capture{}
	l := newLedger(t, c, ledger.Options{})
	if _, ok := l.Publisher(partial{}).(sdk.AsyncPublisher); ok {
		t.Error("the publisher of a broker without PublishAsync claims to have it")
	}
	b := berthtest.NewAsyncPublisher()
	pub, ok := l.Publisher(b).(sdk.AsyncPublisher)
	if !ok {
		t.Fatal("the publisher of a broker with PublishAsync hides it")
	}
	if u, ok := pub.(interface{ Unwrap() sdk.Publisher }); !ok || u.Unwrap() != b {
		t.Error("Unwrap does not return the wrapped publisher")
	}
	ctx := context.Background()
	good := &sdk.Message{ID: "good", Type: "t", IdempotencyKey: "k", Delay: time.Hour}
	bad := &sdk.Message{ID: "bad", Type: "t"}
	rg, err := pub.PublishAsync(ctx, "q", good)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := pub.PublishAsync(ctx, "q", bad)
	if err != nil {
		t.Fatal(err)
	}
	if rg.ID() != "good" || rb.ID() != "bad" {
		t.Errorf("result IDs %q, %q", rg.ID(), rb.ID())
	}
	if _, err := pub.PublishAsync(ctx, "bad queue!", &sdk.Message{}); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("PublishAsync to a bad queue = %v, want ErrInvalidQueue", err)
	}
	if err := l.Flush(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := len(c.all()); n != 0 {
		t.Fatalf("%d events before the broker confirmed anything, want none", n)
	}
	select {
	case <-rg.Done():
		t.Fatal("the result resolved before the broker's")
	default:
	}
	nacked := errors.New("nacked")
	resolve(t, b, "good", nil)
	resolve(t, b, "bad", nacked)
	if err := rg.Wait(testCtx(t, 10*time.Second)); err != nil {
		t.Errorf("confirmed publish: %v", err)
	}
	// Recorded before the result resolved.
	if s := l.Stats(); s.Recorded != 1 {
		t.Errorf("%d events recorded when the confirmed result resolved, want 1", s.Recorded)
	}
	if err := rb.Wait(testCtx(t, 10*time.Second)); !errors.Is(err, nacked) {
		t.Errorf("failed publish: %v, want the broker's error", err)
	}
	if err := l.Flush(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	got := c.all()
	if len(got) != 1 {
		t.Fatalf("recorded %+v, want the confirmed message only", got)
	}
	e := got[0]
	if e.MessageID != "good" || e.Status != ledger.StatusEnqueued || e.Queue != "q" || e.IdempotencyKey != "k" || e.CorrelationID != "good" {
		t.Errorf("event %+v", e)
	}
	if d := e.NextAttemptAt.Sub(e.At); d != time.Hour {
		t.Errorf("NextAttemptAt %v after At, want the delay (1h)", d)
	}
	if b.SyncCalls() > 0 {
		t.Error("the synchronous Publish was used")
	}
}

// TestPublisherAsyncThroughPool: sdk.NewAsyncPublisher over the ledger's
// publisher passes calls to the broker's own PublishAsync (no batching
// pool in between), and a result that resolved before the ledger's
// publisher saw it is recorded too.
func TestPublisherAsyncThroughPool(t *testing.T) {
	c := &capture{}
	l := newLedger(t, c, ledger.Options{})
	b := berthtest.NewAsyncPublisher()
	pool := sdk.NewAsyncPublisher(l.Publisher(b), sdk.AsyncOptions{})
	t.Cleanup(func() { _ = pool.Close() })
	r, err := pool.PublishAsync(context.Background(), "q", &sdk.Message{ID: "m"})
	if err != nil {
		t.Fatal(err)
	}
	resolve(t, b, "m", nil)
	if err := r.Wait(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := c.all(); len(got) != 1 || got[0].MessageID != "m" || got[0].Status != ledger.StatusEnqueued {
		t.Errorf("recorded %+v, want m enqueued", got)
	}
	if b.SyncCalls() > 0 {
		t.Error("the pool published through the synchronous path")
	}
}
