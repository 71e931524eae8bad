package rabbitmq

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// pubConn returns the broker's publishing connection now.
func pubConn(b *Broker) *amqp.Connection {
	b.pub.mu.Lock()
	defer b.pub.mu.Unlock()
	return b.pub.conn
}

// TestHeadersOverFrameMaxRefused: AMQP carries a message's properties and
// headers in one content header frame, which cannot be split, and the server
// answers a frame over its frame_max (128 KiB by default) by closing the
// whole connection (501 FRAME_ERROR). Publish checked only MaxMessageSize
// (16 MiB), so a message with 200 KiB of headers was written, took the
// publishing connection down under every publish, settlement copy and
// declaration on it, and came back as a retryable ErrUnavailable: a
// producer (or the outbox relay) retrying it took the connection down again
// each time. It is refused up front now, as too large, and nothing of its
// batch is published.
func TestHeadersOverFrameMaxRefused(t *testing.T) {
	_, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	conn := pubConn(b)
	big := &sdk.Message{Type: "t", Body: []byte("x"), Headers: map[string]string{"big": strings.Repeat("a", 200<<10)}}
	small := &sdk.Message{Type: "t", Body: []byte("y")}
	err := b.Publish(ctx, q, small, big)
	if !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Fatalf("Publish of 200 KiB of headers: %v, want ErrMessageTooLarge", err)
	}
	if _, err := b.PublishAsync(ctx, q, &sdk.Message{Type: "t", Headers: big.Headers}); !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Fatalf("PublishAsync of 200 KiB of headers: %v, want ErrMessageTooLarge", err)
	}
	if c := pubConn(b); c != conn || c.IsClosed() {
		t.Fatal("the publishing connection was lost")
	}
	if info, err := b.Info(ctx, q); err != nil || info.Ready != 0 {
		t.Fatalf("Info: %+v %v, want nothing of the batch published", info, err)
	}
	// Just inside the bound: published.
	id := sdk.NewID()
	fit := &sdk.Message{ID: id, CorrelationID: id, Type: "t", Headers: map[string]string{"h": ""}}
	fit.Headers["h"] = strings.Repeat("a", int(b.frameMax.Load())-frameOverhead-deadLetterRoom-messageHeaderSize(fit))
	if err := b.Publish(ctx, q, fit); err != nil {
		t.Fatalf("Publish of a message that fits: %v", err)
	}
}

// TestSettlementCopyOverFrameMax: a message published outside berth with
// headers just under the frame limit is delivered, but its dead letter,
// with the reason headers added, no longer fits in one frame. The copy was
// written all the same: the server closed the publishing connection, the
// settlement sent it again after each reconnection until its ctx ended,
// taking the connection down each time, and failed with ErrUnavailable. The
// copy is refused before it is written now: the connection stays up and the
// delivery is requeued at once.
func TestSettlementCopyOverFrameMax(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	fm := int(b.frameMax.Load())
	if fm <= 0 {
		t.Skip("no frame_max negotiated")
	}
	p := amqp.Publishing{MessageId: "foreign-big", Type: "t", DeliveryMode: amqp.Persistent, Headers: amqp.Table{"h": ""}, Body: []byte("x")}
	p.Headers["h"] = strings.Repeat("a", fm-frameOverhead-contentHeaderSize(p)-200)
	ch := ownChannel(t, url, true)
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, p)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := confirm.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("confirm: %v %v", ok, err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	conn := pubConn(b)
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	defer scancel()
	err = ds[0].DeadLetter(sctx, errors.New(strings.Repeat("r", 1000)))
	if !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Fatalf("DeadLetter of a copy over frame_max: %v, want ErrMessageTooLarge", err)
	}
	if c := pubConn(b); c != conn || c.IsClosed() {
		t.Fatal("the publishing connection was lost")
	}
	// Requeued: delivered again.
	ds, err = b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Message().ID != "foreign-big" {
		t.Fatalf("got %s", ds[0].Message().ID)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
