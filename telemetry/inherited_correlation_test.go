package telemetry_test

import (
	"context"
	"testing"

	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// TestInheritedCorrelationIDNotValidUTF8: a handler runs with the
// correlation ID of the message it handles, which a producer outside berth
// may write with any bytes (AMQP's correlation-id is a raw short string).
// Publishing a follow-up without telemetry works: sdk.Prepare replaces such
// an inherited ID by a text one. Through Observer.Publisher the follow-up
// was refused (ErrInvalidMessage, or ErrInvalidHeader with a correlation
// header): the publisher copied the raw ID into the message first, where
// Prepare takes it for one the caller chose. It now carries the ID Prepare
// gives, in the message, the correlation header and the span.
func TestInheritedCorrelationIDNotValidUTF8(t *testing.T) {
	const raw = "flow-\xff\xfe-1"
	ctx := sdk.WithCorrelationID(context.Background(), raw)
	b := newMemory(t)
	want := &sdk.Message{Type: "t"}
	if err := b.Publish(ctx, "q", want); err != nil {
		t.Fatalf("publish without telemetry: %v", err)
	}
	pool := sdk.NewAsyncPublisher(b, sdk.AsyncOptions{})
	t.Cleanup(func() { _ = pool.Close() })

	for _, header := range []string{"", "x-correlation-id"} {
		tp, rec := newTracing(t)
		obs, _ := newObserver(t, tp, telemetry.Options{CorrelationHeader: header})
		pub := obs.Publisher(b)
		one := &sdk.Message{Type: "t"}
		if err := pub.Publish(ctx, "q", one); err != nil {
			t.Errorf("header %q: Publish: %v", header, err)
		}
		batch := []*sdk.Message{{Type: "t"}, {Type: "t"}}
		if err := pub.Publish(ctx, "q", batch...); err != nil {
			t.Errorf("header %q: batch Publish: %v", header, err)
		}
		async := &sdk.Message{Type: "t"}
		res, err := asyncOf(t, obs.Publisher(pool)).PublishAsync(ctx, "q", async)
		if err == nil {
			err = res.Wait(waitCtx(t))
		}
		if err != nil {
			t.Errorf("header %q: PublishAsync: %v", header, err)
		}
		for _, m := range append(batch, one, async) {
			if m.CorrelationID != want.CorrelationID {
				t.Errorf("header %q: correlation ID %q, want %q as Prepare gives", header, m.CorrelationID, want.CorrelationID)
			}
			if header != "" && m.Header(header) != want.CorrelationID {
				t.Errorf("header %q = %q, want %q", header, m.Header(header), want.CorrelationID)
			}
		}
		for _, s := range rec.Ended() {
			if c, ok := attrsOf(s)["messaging.message.conversation_id"]; ok && c.AsString() != want.CorrelationID {
				t.Errorf("span %s: conversation ID %q, want %q", s.Name(), c.AsString(), want.CorrelationID)
			}
		}
	}
}
