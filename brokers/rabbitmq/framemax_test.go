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
// taking the connection down each time. Then it was refused before it was
// written, and the delivery requeued — for ever on a classic queue. Now its
// annotations are shortened to fit ([sdk.FitDeadLetter]), leaving room for
// a walk's stamp: the reason is cut when that is enough, every annotation
// left out when not, and the letter can be listed and redriven. Only a
// message with no room even for the marker is still refused and requeued,
// the connection staying up.
func TestSettlementCopyOverFrameMax(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	fm := int(b.frameMax.Load())
	if fm <= 0 {
		t.Fatal("no frame_max negotiated")
	}
	ch := ownChannel(t, url, true)
	// publish sends, outside berth, a message whose content header frame
	// is room bytes under the limit, and returns its header h.
	publish := func(id string, room int) string {
		t.Helper()
		p := amqp.Publishing{MessageId: id, Type: "t", DeliveryMode: amqp.Persistent, Headers: amqp.Table{"h": ""}, Body: []byte("x")}
		p.Headers["h"] = strings.Repeat("a", fm-frameOverhead-contentHeaderSize(p)-room)
		confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, p)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := confirm.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("confirm: %v %v", ok, err)
		}
		return p.Headers["h"].(string)
	}
	// receive receives one delivery, of message id unless id is "".
	receive := func(id string) sdk.Delivery {
		t.Helper()
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got := ds[0].Message().ID; id != "" && got != id {
			t.Fatalf("received %s, want %s", got, id)
		}
		return ds[0]
	}
	conn := pubConn(b)
	reason := strings.Repeat("r", 1000)
	for _, tc := range []struct {
		id        string
		room      int
		truncated string
	}{{"foreign-reason", 400, "reason"}, {"foreign-all", 150, "all"}} {
		h := publish(tc.id, tc.room)
		if err := receive(tc.id).DeadLetter(ctx, errors.New(reason)); err != nil {
			t.Fatalf("%s: DeadLetter: %v", tc.id, err)
		}
		dl, err := b.GetDeadLetter(ctx, q, tc.id)
		if err != nil {
			t.Fatalf("%s: GetDeadLetter: %v", tc.id, err)
		}
		if got := dl.Header(HeaderDeadLetterTruncated); got != tc.truncated {
			t.Errorf("%s: %s = %q, want %q", tc.id, HeaderDeadLetterTruncated, got, tc.truncated)
		}
		r := dl.Header(sdk.HeaderDeadLetterReason)
		switch tc.truncated {
		case "reason":
			if !strings.HasSuffix(r, "…") || len(r) >= len(reason) || dl.Header(sdk.HeaderDeadLetterClass) == "" {
				t.Errorf("%s: reason %d bytes %q…, class %q; want the reason cut, the other annotations kept",
					tc.id, len(r), r[:min(len(r), 20)], dl.Header(sdk.HeaderDeadLetterClass))
			}
		case "all":
			if r != "" || dl.Header(sdk.HeaderDeadLetterQueue) != "" {
				t.Errorf("%s: annotations kept: %v", tc.id, dl.Headers)
			}
		}
		if dl.Header("h") != h || string(dl.Body) != "x" {
			t.Errorf("%s: the message's own header or body changed", tc.id)
		}
	}
	// Both letters can be walked past and redriven: the redriven messages
	// carry no marker.
	if n, err := b.RedriveDeadLetters(ctx, q, "foreign-reason", "foreign-all"); err != nil || n != 2 {
		t.Fatalf("redrive: %d, %v; want 2", n, err)
	}
	for range 2 {
		d := receive("")
		if v := d.Message().Header(HeaderDeadLetterTruncated); v != "" {
			t.Errorf("redriven %s keeps %s = %q", d.Message().ID, HeaderDeadLetterTruncated, v)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// No room even for the marker: refused before it is written, requeued.
	publish("foreign-full", 20)
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	defer scancel()
	if err := receive("foreign-full").DeadLetter(sctx, errors.New(reason)); !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Fatalf("DeadLetter of a copy over frame_max: %v, want ErrMessageTooLarge", err)
	}
	if c := pubConn(b); c != conn || c.IsClosed() {
		t.Fatal("the publishing connection was lost")
	}
	if err := receive("foreign-full").Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
