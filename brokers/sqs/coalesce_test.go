package sqs_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aws/smithy-go/middleware"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// gate holds every SendMessageBatch call until it is opened.
type gate struct {
	open    chan struct{}
	arrived chan struct{} // one token per call that reached the gate
}

func newGate() *gate { return &gate{open: make(chan struct{}), arrived: make(chan struct{}, 100)} }

func (g *gate) option(st *middleware.Stack) error {
	return onOperation("SendMessageBatch", func(ctx context.Context) error {
		g.arrived <- struct{}{}
		select {
		case <-g.open:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})(st)
}

// waitQueued waits until n entries wait in b's coalescer.
func waitQueued(t *testing.T, b *sqs.Broker, n int) {
	t.Helper()
	ctx := testCtx(t)
	for sqs.QueuedShared(b) != n {
		select {
		case <-ctx.Done():
			t.Fatalf("%d entries queued, want %d", sqs.QueuedShared(b), n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// publisher returns a func that publishes one message of type typ to q and
// sends its ID on ids (room for n), failing t if Publish fails.
func publisher(ctx context.Context, t *testing.T, b *sqs.Broker, q, typ string, n int) (func(), chan string) {
	ids := make(chan string, n)
	return func() {
		m := &sdk.Message{Type: typ, Body: []byte("x")}
		if err := b.Publish(ctx, q, m); err != nil {
			t.Errorf("Publish: %v", err)
			return
		}
		ids <- m.ID
	}, ids
}

// TestPublishSharesCalls: with its one sender busy, 25 concurrent Publish
// calls of one message each wait, and are then sent 10 to a call: 1 + 3
// SendMessageBatch calls for 26 messages, every one delivered once.
func TestPublishSharesCalls(t *testing.T) {
	c, g := newCalls(), newGate()
	b := newBroker(t, sqs.Options{VisibilityTimeout: time.Minute, WaitTime: time.Second, PublishSenders: 1}, c.option, g.option)
	q := declare(t, b, "shared", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	c.reset()

	var wg sync.WaitGroup
	publish, ids := publisher(ctx, t, b, q, "shared", 26)
	wg.Go(publish)
	<-g.arrived // the first call holds the sender
	for range 25 {
		wg.Go(publish)
	}
	waitQueued(t, b, 25)
	close(g.open)
	wg.Wait()
	close(ids)
	if n := c.get("SendMessageBatch"); n != 4 {
		t.Errorf("%d SendMessageBatch calls for 26 messages with one sender, want 1 + 3", n)
	}
	receiveAll(ctx, t, q, ids, 26)
}

// TestPublishSharedCancelled: a Publish whose ctx ends while its message
// waits for a sender returns ctx's error and its message is never sent; the
// others are.
func TestPublishSharedCancelled(t *testing.T) {
	g := newGate()
	b := newBroker(t, sqs.Options{VisibilityTimeout: time.Minute, WaitTime: time.Second, PublishSenders: 1}, g.option)
	q := declare(t, b, "sharedcancel", false, sqs.QueueConfig{})
	ctx := testCtx(t)

	first := &sdk.Message{Type: "first", Body: []byte("1")}
	errc := make(chan error, 2)
	go func() { errc <- b.Publish(ctx, q, first) }()
	<-g.arrived
	cctx, cancel := context.WithCancel(ctx)
	gone := &sdk.Message{Type: "gone", Body: []byte("2")}
	cancelled := make(chan error, 1)
	go func() { cancelled <- b.Publish(cctx, q, gone) }()
	waitQueued(t, b, 1)
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Publish: %v, want context.Canceled", err)
	}
	if n := sqs.QueuedShared(b); n != 0 {
		t.Errorf("%d entries still queued after the cancelled Publish returned", n)
	}
	close(g.open)
	if err := <-errc; err != nil {
		t.Fatalf("first Publish: %v", err)
	}
	// Read through a broker with a short visibility timeout (see
	// receiveAll): a ReceiveMessage answer the emulator loses hides its
	// message for that long, a minute on b, past the test's deadline.
	rb := newBroker(t, sqs.Options{VisibilityTimeout: 3 * time.Second, WaitTime: time.Second})
	ds := receiveN(t, rb, q, 1)
	if id := ds[0].Message().ID; id != first.ID {
		t.Errorf("delivered %s, want the first message %s", id, first.ID)
	}
	if err := ds[0].Ack(ctx); err != nil { // not back after its short lease
		t.Fatal(err)
	}
	// Nothing else arrives: the cancelled message was not sent.
	more, err := rb.Receive(ctx, q, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range more {
		t.Errorf("delivered %s (%s): the cancelled Publish's message was sent", d.Message().ID, d.Message().Type)
	}
}

// TestPublishOnePartialCallUnderLoad: while a full call (10 messages) is in
// flight to a queue, at most one call of fewer is too: single-message
// Publish calls wait for it instead of each starting a call, though 14
// senders are free; once 10 wait they go at once in one full call; the rest
// go together when the partial call returns. 26 messages, 4 SendMessageBatch
// calls (10, 1, 10, 5), each message delivered once.
func TestPublishOnePartialCallUnderLoad(t *testing.T) {
	c, g := newCalls(), newGate()
	b := newBroker(t, sqs.Options{VisibilityTimeout: time.Minute, WaitTime: time.Second, PublishSenders: 16}, c.option, g.option)
	q := declare(t, b, "partial", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	c.reset()

	var wg sync.WaitGroup
	publish, ids := publisher(ctx, t, b, q, "partial", 26)
	wg.Go(func() {
		batch := make([]*sdk.Message, 10)
		for i := range batch {
			batch[i] = &sdk.Message{Type: "full", Body: []byte("x")}
		}
		if err := b.Publish(ctx, q, batch...); err != nil {
			t.Errorf("Publish of 10: %v", err)
			return
		}
		for _, m := range batch {
			ids <- m.ID
		}
	})
	<-g.arrived // the full call is in flight
	wg.Go(publish)
	<-g.arrived // a partial call (one message) too
	for range 5 {
		wg.Go(publish)
	}
	waitQueued(t, b, 5)
	select {
	case <-g.arrived:
		t.Fatal("a second partial call started while a full and a partial call were in flight")
	case <-time.After(50 * time.Millisecond):
	}
	for range 10 {
		wg.Go(publish)
	}
	select {
	case <-g.arrived: // a full call of the 10 oldest
	case <-ctx.Done():
		t.Fatal("no full call started while 15 messages waited")
	}
	waitQueued(t, b, 5)
	close(g.open)
	wg.Wait()
	close(ids)
	if n := c.get("SendMessageBatch"); n != 4 {
		t.Errorf("%d SendMessageBatch calls for 26 messages, want 4 (10, 1, a full 10, the 5 left)", n)
	}
	receiveAll(ctx, t, q, ids, 26)
}

// TestPublishPartialCallsInParallel: without a full call in flight (a few
// concurrent callers), single-message Publish calls do not wait for a
// partial call in flight: they are sent at once, in calls of their own or
// sharing one, while the first is still held.
func TestPublishPartialCallsInParallel(t *testing.T) {
	g := newGate()
	b := newBroker(t, sqs.Options{VisibilityTimeout: time.Minute, WaitTime: time.Second, PublishSenders: 16}, g.option)
	q := declare(t, b, "parallel", false, sqs.QueueConfig{})
	ctx := testCtx(t)

	var wg sync.WaitGroup
	publish, ids := publisher(ctx, t, b, q, "parallel", 5)
	wg.Go(publish)
	<-g.arrived // the first call (one message) is held
	for range 4 {
		wg.Go(publish)
	}
	select {
	case <-g.arrived: // another call is on the wire beside the first
	case <-ctx.Done():
		t.Fatalf("Publish calls waited for a partial call in flight (%d queued)", sqs.QueuedShared(b))
	}
	close(g.open)
	wg.Wait()
	close(ids)
	receiveAll(ctx, t, q, ids, 5)
}

// receiveAll checks that the IDs on ids (closed) are n messages, then
// receives and acks q's messages until it has seen each of them, once. It
// reads through a broker with a short visibility timeout: now and then the
// emulator's answer to a ReceiveMessage is lost on the wire after it handed
// messages out (the SDK retries the call), and those come back only when
// the visibility expires.
func receiveAll(ctx context.Context, t *testing.T, q string, ids <-chan string, n int) {
	t.Helper()
	want := map[string]bool{}
	for id := range ids {
		want[id] = true
	}
	if len(want) != n {
		t.Fatalf("%d messages published, want %d", len(want), n)
	}
	rb := newBroker(t, sqs.Options{VisibilityTimeout: 3 * time.Second, WaitTime: time.Second})
	for len(want) > 0 {
		ds, err := rb.Receive(ctx, q, 10)
		if err != nil {
			t.Fatalf("Receive: %v (%d of %d messages not seen)", err, len(want), n)
		}
		for _, d := range ds {
			if !want[d.Message().ID] {
				t.Errorf("message %s delivered twice or never published", d.Message().ID)
			}
			delete(want, d.Message().ID)
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}
