package brokertest

import (
	"context"
	"errors"
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
