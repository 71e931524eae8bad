package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestAsyncUnroutableWhileChannelOpens: PublishAsync results of messages no
// queue takes must fail (UnroutableError) even while another publish channel
// of the same connection is being opened. publisher() used to hold b.mu
// across conn.Channel(), whose reply the connection's reader goroutine
// delivers; the confirm loop, forgetting the unroutable queue, waited for
// b.mu, and the reader, handing it the next basic.return on an unbuffered
// channel, waited for the loop. amqp091 gives up such a send after 5 s and
// drops the return: the message's confirm (an ack) then resolved its result
// with nil, a message the server dropped reported published.
func TestAsyncUnroutableWhileChannelOpens(t *testing.T) {
	raw := serverURL(t)
	p, purl := startFaultProxy(t, raw)
	b := newBroker(t, purl, Options{NoDeclare: true, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	missing := testQueue(t, raw) // never declared: every publish to it comes back

	// Open the default publish channel first, so that PublishAsync below
	// needs no reply to write its messages.
	if _, err := b.publisher(ctx, ""); err != nil {
		t.Fatal(err)
	}
	// Hold the server's replies: the returns and confirms of the messages
	// below, then the channel.open-ok of the dead-letter channel, reach the
	// broker together, in that order, once thawed.
	p.FreezeReplies()
	const n = 4
	results := make([]*sdk.PublishResult, 0, n)
	for range n {
		res, err := b.PublishAsync(ctx, missing, &sdk.Message{Type: "unroutable"})
		if err != nil {
			p.Thaw()
			t.Fatalf("PublishAsync: %v", err)
		}
		results = append(results, res)
	}
	time.Sleep(200 * time.Millisecond) // the server routes them (nowhere) before the channel.open below
	opened := make(chan error, 1)
	go func() {
		_, err := b.publisher(ctx, b.opts.DeadLetterExchange)
		opened <- err
	}()
	time.Sleep(200 * time.Millisecond) // channel.open written, its reply held
	p.Thaw()
	if err := <-opened; err != nil {
		t.Fatalf("open the dead-letter publish channel: %v", err)
	}
	for i, res := range results {
		err := res.Wait(ctx)
		if ctx.Err() != nil {
			t.Fatalf("result %d unresolved", i)
		}
		var ue *UnroutableError
		if !errors.As(err, &ue) || !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("result %d of a message no queue took: %v; want an UnroutableError (ErrNotFound)", i, err)
		}
	}
}
