package jetstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestPublishPathsBeyondReconnectBufferUnavailable: Publish and
// PublishAsync refuse at once while the connection is down (connected),
// but the connection may go down between that check and the write; the
// write is then refused by nats.go with nats.ErrReconnectBufExceeded once
// its reconnect buffer is full (here disabled, so at once). Publish's
// single-message and batch paths and PublishAsync's, entered past the
// check, must report it wrapping sdk.ErrUnavailable, as a retry will do.
func TestPublishPathsBeyondReconnectBufferUnavailable(t *testing.T) {
	u, p := integration.ProxyURL(t, integration.NATSURL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b, err := Connect(ctx, u.String(), ConnectOptions{
		Name:          "berth-test-reconnectbuf",
		ReconnectWait: 50 * time.Millisecond,
		Extra:         []nats.Option{nats.ReconnectBufSize(-1)},
	}, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var sfx [6]byte
	_, _ = rand.Read(sfx[:])
	queue := "reconnectbuf_" + hex.EncodeToString(sfx[:])
	qs, err := b.queue(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := Connect(ctx, integration.NATSURL(t), ConnectOptions{Name: "berth-test-cleanup"}, Options{})
		if err != nil {
			t.Errorf("cleanup connect: %v", err)
			return
		}
		defer c.Close()
		if err := c.DeleteQueue(ctx, queue); err != nil {
			t.Errorf("DeleteQueue(%q): %v", queue, err)
		}
	}()

	p.Refuse(true)
	p.Reset()
	for b.connected("test") == nil {
		select {
		case <-ctx.Done():
			t.Fatal("the connection did not notice the reset")
		case <-time.After(5 * time.Millisecond):
		}
	}
	wire := func(n int) ([]*nats.Msg, []*sdk.Message) {
		msgs := make([]*sdk.Message, n)
		ws := make([]*nats.Msg, n)
		for i := range msgs {
			msgs[i] = &sdk.Message{Type: "reconnectbuf"}
			if err := sdk.Prepare(ctx, queue, msgs[i], 0); err != nil {
				t.Fatal(err)
			}
			w, err := encode(msgs[i], nil, qs.ready, 1, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			ws[i] = w
		}
		return ws, msgs
	}
	for _, n := range []int{1, 3} { // publishSingle, publishWire
		ws, msgs := wire(n)
		if err := b.publishTo(ctx, qs, ws, msgs); !errors.Is(err, sdk.ErrUnavailable) {
			t.Errorf("Publish of %d past the connection check, beyond the reconnect buffer: %v; want an error wrapping sdk.ErrUnavailable", n, err)
		}
	}
	ws, msgs := wire(1)
	if _, _, _, err := b.publishTracked(ctx, ws[0], msgs[0].ID, msgID(msgs[0].ID)); !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("PublishAsync past the connection check, beyond the reconnect buffer: %v; want an error wrapping sdk.ErrUnavailable", err)
	}
	if n := len(b.slots); n != 0 {
		t.Errorf("%d publish slots held after refused publishes", n)
	}
}
