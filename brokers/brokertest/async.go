package brokertest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// testAsyncPublish checks asynchronous publishing through
// [sdk.NewAsyncPublisher] (the broker's own PublishAsync when it has one,
// the batching fallback otherwise): every result resolves, each with its own
// message's outcome; a context already done publishes nothing; messages
// whose results succeeded are all delivered, once each.
func testAsyncPublish(t *testing.T, e *env) {
	ap := sdk.NewAsyncPublisher(e.b, sdk.AsyncOptions{MaxInFlight: 16})
	defer func() { _ = ap.Close() }()
	ctx := e.ctx(t)

	// A context already done: ctx.Err() itself, nothing published.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	refused := textMessage("async-cancelled")
	if res, err := ap.PublishAsync(cancelled, e.q, refused); err != context.Canceled || res != nil {
		t.Errorf("PublishAsync with a context already done: %v, %v; want nil, context.Canceled", res, err)
	}
	// An invalid message fails on its own, at once.
	bad := textMessage("async-bad-header")
	bad.Headers = map[string]string{sdk.ReservedHeaderPrefix + "x": "y"}
	if _, err := ap.PublishAsync(ctx, e.q, bad); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("PublishAsync of a reserved header: %v, want ErrInvalidMessage", err)
	}

	// From one goroutine and from several at once, more than MaxInFlight.
	const single, callers, each = 100, 4, 25
	var mu sync.Mutex
	var results []*sdk.PublishResult
	want := map[string]bool{}
	publish := func(text string) {
		m := textMessage(text)
		res, err := ap.PublishAsync(ctx, e.q, m)
		if err != nil {
			t.Errorf("PublishAsync: %v", err)
			return
		}
		if res.ID() != m.ID || m.ID == "" {
			t.Errorf("result ID %q, message ID %q", res.ID(), m.ID)
		}
		mu.Lock()
		results = append(results, res)
		want[m.ID] = true
		mu.Unlock()
	}
	for range single {
		publish("async-single")
	}
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				publish("async-concurrent")
			}
		}()
	}
	// An oversized message fails alone (at once or in its result), while
	// the others of the same moment are published.
	var big *sdk.Message
	var bigRes *sdk.PublishResult
	if e.supports(CapMaxMessageSize) && e.h.MaxMessageSize > 0 {
		big = &sdk.Message{Type: "brokertest.big", Body: make([]byte, e.h.MaxMessageSize+1)}
		res, err := ap.PublishAsync(ctx, e.q, big)
		switch {
		case err != nil && !errors.Is(err, sdk.ErrMessageTooLarge):
			t.Errorf("PublishAsync of an oversized message: %v, want ErrMessageTooLarge", err)
		case err == nil:
			bigRes = res
		}
	}
	wg.Wait()
	for _, res := range results {
		if err := res.Wait(ctx); err != nil {
			t.Fatalf("result of %s: %v", res.ID(), err)
		}
		select {
		case <-res.Done():
		default:
			t.Fatal("Wait returned before Done was closed")
		}
		if res.Err() != nil {
			t.Errorf("Err after Wait: %v", res.Err())
		}
	}
	if bigRes != nil {
		if err := bigRes.Wait(ctx); !errors.Is(err, sdk.ErrMessageTooLarge) {
			t.Errorf("result of an oversized message: %v, want ErrMessageTooLarge", err)
		}
	}
	if len(want) != single+callers*each {
		t.Fatalf("%d messages accepted, want %d", len(want), single+callers*each)
	}
	got := map[string]bool{}
	for len(got) < len(want) {
		for _, d := range e.receive(t, 10) {
			id := d.Message().ID
			switch {
			case id == refused.ID || id == bad.ID || (big != nil && id == big.ID):
				t.Errorf("refused message %s was delivered", id)
			case !want[id]:
				t.Errorf("unexpected message %s", id)
			case got[id]:
				t.Errorf("message %s delivered twice", id)
			}
			got[id] = true
			settleAck(t, ctx, d)
		}
	}
	e.expectNone(t, 200*time.Millisecond)

	// Close: later calls fail with ErrClosed; a second Close is a no-op.
	if err := ap.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := ap.PublishAsync(ctx, e.q, textMessage("after-close")); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("PublishAsync after the pool's Close: %v, want ErrClosed", err)
	}
	if err := ap.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// testAsyncPublishBrokerClose checks that closing the broker resolves every
// outstanding asynchronous result: none is left hanging.
func testAsyncPublishBrokerClose(t *testing.T, e *env) {
	ap := sdk.NewAsyncPublisher(e.b, sdk.AsyncOptions{MaxInFlight: 64})
	ctx := e.ctx(t)
	var results []*sdk.PublishResult
	for range 200 {
		res, err := ap.PublishAsync(ctx, e.q, textMessage("async-close"))
		if err != nil {
			break
		}
		results = append(results, res)
		if len(results) == 50 {
			go func() { _ = e.b.Close() }()
		}
	}
	for _, res := range results {
		err := res.Wait(ctx)
		if err != nil && ctx.Err() != nil {
			t.Fatalf("result %s did not resolve after the broker closed", res.ID())
		}
		if err != nil && !errors.Is(err, sdk.ErrClosed) && !errors.Is(err, sdk.ErrUnavailable) {
			t.Errorf("result %s: %v, want nil, ErrClosed or ErrUnavailable", res.ID(), err)
		}
	}
	if err := ap.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// testAsyncPublishCloseKeepsOutcomes checks that closing on a healthy
// server does not turn published messages into failures: a broker with its
// own PublishAsync waits, within its close bound, for the answers of what
// it already sent, and the batching pool's Close for what it accepted,
// before the broker closes. A result failed ErrClosed ("perhaps
// published") for a stored message makes its producer retry or report it
// for nothing.
func testAsyncPublishCloseKeepsOutcomes(t *testing.T, e *env) {
	ctx := e.ctx(t)
	const n = 200
	native, isNative := e.b.(sdk.AsyncPublisher)
	var ap sdk.AsyncPublisher = native
	var pool *sdk.AsyncPool
	if !isNative {
		pool = sdk.NewAsyncPublisher(e.b, sdk.AsyncOptions{MaxInFlight: 64})
		ap = pool
	}
	results := make([]*sdk.PublishResult, 0, n)
	for range n {
		res, err := ap.PublishAsync(ctx, e.q, textMessage("async-close-outcome"))
		if err != nil {
			t.Fatalf("PublishAsync: %v", err)
		}
		results = append(results, res)
	}
	if pool != nil {
		if err := pool.Close(); err != nil {
			t.Errorf("the pool's Close: %v", err)
		}
	}
	if err := e.b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	failed := 0
	for _, res := range results {
		select {
		case <-res.Done():
		default:
			t.Fatalf("result %s unresolved after Close", res.ID())
		}
		if err := res.Err(); err != nil {
			if failed++; failed <= 3 {
				t.Errorf("result %s: %v, want nil (the server is healthy)", res.ID(), err)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d results failed across Close (native PublishAsync: %v)", failed, n, isNative)
	}
}

// testAckAll checks [sdk.AckAll] (the broker's BatchAcker when it has one):
// it acks exactly the deliveries given — never one held by someone else,
// received before them — and reports a delivery already settled on its own.
func testAckAll(t *testing.T, e *env) {
	ctx := e.ctx(t)
	const n = 30
	for i := range n {
		e.publish(t, textMessage("ackall-"+strconv.Itoa(i)))
	}
	ds := e.receiveN(t, n)
	held, batch := ds[:5], ds[5:] // the first received stay with "another goroutine"
	done := batch[0]
	settleAck(t, ctx, done) // settled already: AckAll must say so, for it alone
	err := sdk.AckAll(ctx, e.b, batch)
	if !errors.Is(err, sdk.ErrAlreadySettled) {
		t.Fatalf("AckAll with one delivery already acked: %v, want ErrAlreadySettled", err)
	}
	if !strings.Contains(err.Error(), done.Message().ID) {
		t.Errorf("AckAll error %q does not name message %s", err, done.Message().ID)
	}
	for _, d := range batch[1:] {
		if err := d.Ack(ctx); !errors.Is(err, sdk.ErrAlreadySettled) {
			t.Errorf("Ack after AckAll: %v, want ErrAlreadySettled", err)
		}
	}
	// The held deliveries were not acked behind their holder's back: given
	// up (their consumer dies), they come back, and only they.
	time.Sleep(200 * time.Millisecond) // let the server apply the acks before a consumer dies (RabbitMQ quorum queues apply them asynchronously)
	want := map[string]bool{}
	for _, d := range held {
		want[d.Message().ID] = true
		e.abandon(t, d)
	}
	for len(want) > 0 {
		for _, d := range e.receive(t, len(want)) {
			if !want[d.Message().ID] {
				t.Errorf("message %s came back after AckAll acked it", d.Message().ID)
			}
			delete(want, d.Message().ID)
			settleAck(t, ctx, d)
		}
	}
	e.expectNone(t, e.h.Lease/2)
	// The broker still works after it (RabbitMQ: the channel was not
	// closed by an ack of an unknown tag).
	e.publish(t, textMessage("after-ackall"))
	if err := sdk.AckAll(ctx, e.b, []sdk.Delivery{e.receiveOne(t)}); err != nil {
		t.Errorf("AckAll of one: %v", err)
	}
	if err := sdk.AckAll(ctx, e.b, nil); err != nil {
		t.Errorf("AckAll of none: %v", err)
	}
}

// testAsyncPublishConnectionLoss cuts the connection while asynchronous
// publishes are in flight: every result resolves (nil, or an error wrapping
// ErrUnavailable that says to publish again), and every message whose
// result was nil, or that was published again after an error, is delivered.
func testAsyncPublishConnectionLoss(t *testing.T, e *env) {
	b, cut := e.h.Faulty(t)
	t.Cleanup(func() { _ = b.Close() })
	q := e.queue(t, b)
	ctx := e.ctx(t)
	ap := sdk.NewAsyncPublisher(b, sdk.AsyncOptions{MaxInFlight: 32})
	defer func() { _ = ap.Close() }()
	const n = 200
	want := map[string]bool{}
	var results []*sdk.PublishResult
	var retry []*sdk.Message
	msgs := map[string]*sdk.Message{}
	for i := range n {
		if i == n/2 {
			cut()
		}
		m := textMessage("async-cut-" + strconv.Itoa(i))
		m.ID = sdk.NewID()
		msgs[m.ID] = m
		want[m.ID] = true
		res, err := ap.PublishAsync(ctx, q, m)
		if err != nil {
			if !errors.Is(err, sdk.ErrUnavailable) || ctx.Err() != nil {
				t.Fatalf("PublishAsync around a connection loss: %v, want nil or ErrUnavailable", err)
			}
			retry = append(retry, m)
			continue
		}
		results = append(results, res)
	}
	for _, res := range results {
		err := res.Wait(ctx)
		if ctx.Err() != nil {
			t.Fatalf("result %s unresolved within the harness timeout", res.ID())
		}
		if err != nil {
			if !errors.Is(err, sdk.ErrUnavailable) {
				t.Errorf("result %s: %v, want nil or ErrUnavailable", res.ID(), err)
			}
			retry = append(retry, msgs[res.ID()])
		}
	}
	for _, m := range retry { // publishing again is safe: duplicates are allowed below
		for {
			err := b.Publish(ctx, q, m)
			if err == nil {
				break
			}
			if !errors.Is(err, sdk.ErrUnavailable) || ctx.Err() != nil {
				t.Fatalf("Publish again after the cut: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("%d of %d published again after the cut", len(retry), n)
	for len(want) > 0 {
		ds, err := b.Receive(ctx, q, 50)
		if err != nil {
			if errors.Is(err, sdk.ErrUnavailable) && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			t.Fatalf("Receive with %d of %d still missing: %v", len(want), n, err)
		}
		for _, d := range ds {
			delete(want, d.Message().ID) // a message stored twice (lost confirm) is allowed
			_ = d.Ack(ctx)
		}
	}
}
