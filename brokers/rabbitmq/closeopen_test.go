package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestPublishWhileCloseCutsChannelOpen: a publish whose confirm channel is
// being opened when Close runs must fail with ErrClosed, as every call cut
// by Close does, not with a retryable ErrUnavailable. publisher() no longer
// holds b.mu across the channel's opening, so Close goes ahead and closes
// the connection under it, and conn.Channel() fails with the connection's
// error.
func TestPublishWhileCloseCutsChannelOpen(t *testing.T) {
	raw := serverURL(t)
	p, purl := startFaultProxy(t, raw)
	t.Cleanup(p.Thaw)
	b := newBroker(t, purl, Options{NoDeclare: true, CloseTimeout: 300 * time.Millisecond, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	q := testQueue(t, raw)

	// No publish channel yet: the PublishAsync below opens one, and its
	// channel.open-ok is held.
	p.FreezeReplies()
	published := make(chan error, 1)
	go func() {
		_, err := b.PublishAsync(ctx, q, &sdk.Message{Type: "cut"})
		published <- err
	}()
	time.Sleep(200 * time.Millisecond) // channel.open written, its reply held
	closed := make(chan struct{})
	go func() {
		_ = b.Close()
		close(closed)
	}()
	var perr error
	select {
	case perr = <-published:
	case <-ctx.Done():
		p.Thaw()
		t.Fatal("PublishAsync did not return")
	}
	p.Thaw()
	<-closed
	if !errors.Is(perr, sdk.ErrClosed) {
		t.Fatalf("PublishAsync cut by Close while its channel opened: %v; want sdk.ErrClosed", perr)
	}
}
