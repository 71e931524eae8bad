package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestPublishWaitingForChannelOpenHonoursCtx: a Publish whose ctx ends
// while the publish channel is being opened returns, with its ctx's error,
// whether it waits for another caller's opening or started the opening
// itself. publisher() used to serialise the opening under a mutex held
// across the server round trips: on a stalled connection every Publish
// needing the channel waited for that mutex, its ctx ignored, until the
// heartbeat gave the connection up.
func TestPublishWaitingForChannelOpenHonoursCtx(t *testing.T) {
	raw := serverURL(t)
	p, purl := startFaultProxy(t, raw)
	t.Cleanup(p.Thaw)
	b := newBroker(t, purl, Options{NoDeclare: true, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	q := testQueue(t, raw)
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	if b.pcCur[pubDefault].Load() != nil {
		t.Fatal("a publish channel is open already; the test needs the Publish below to open it")
	}

	// The first Publish opens the channel; its channel.open-ok is held.
	p.FreezeReplies()
	openerCtx, cancelOpener := context.WithCancel(ctx)
	defer cancelOpener()
	opener := make(chan error, 1)
	go func() { opener <- b.Publish(openerCtx, q, &sdk.Message{Type: "opener"}) }()
	time.Sleep(200 * time.Millisecond) // channel.open written, its reply held

	waiterCtx, cancelWaiter := context.WithCancel(ctx)
	defer cancelWaiter()
	waiter := make(chan error, 1)
	go func() { waiter <- b.Publish(waiterCtx, q, &sdk.Message{Type: "waiter"}) }()
	time.Sleep(200 * time.Millisecond) // waiting for the opening

	// Below the 15 s (3 half heartbeats of the default 10 s) after which
	// amqp091 gives the stalled connection up, which would end the opening
	// regardless.
	const bound = 10 * time.Second
	returned := func(who string, ch <-chan error) error {
		t.Helper()
		select {
		case err := <-ch:
			return err
		case <-time.After(bound):
			p.Thaw()
			t.Fatalf("%s Publish did not return after its ctx ended, the channel's opening held", who)
			return nil
		}
	}
	cancelWaiter()
	if err := returned("waiting", waiter); !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish cancelled while waiting for another's channel opening: %v; want context.Canceled", err)
	}
	cancelOpener()
	if err := returned("opening", opener); !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish cancelled while opening the channel: %v; want context.Canceled", err)
	}

	// The opening goes on for the next caller.
	p.Thaw()
	if err := b.Publish(ctx, q, &sdk.Message{Type: "after"}); err != nil {
		t.Fatalf("Publish once the replies flow again: %v", err)
	}
}
