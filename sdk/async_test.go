package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// gatePublisher records every Publish call and holds each until released.
type gatePublisher struct {
	mu    sync.Mutex
	calls [][]string // message IDs per call
	gate  chan struct{}
	fail  func(m *sdk.Message) error // per message; nil accepts
	whole error                      // refuses a whole call of several
}

func (g *gatePublisher) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	if g.gate != nil {
		select {
		case <-g.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ids := make([]string, len(msgs))
	failed := map[string]error{}
	for i, m := range msgs {
		ids[i] = m.ID
		if g.fail != nil {
			if err := g.fail(m); err != nil {
				failed[m.ID] = err
			}
		}
	}
	g.mu.Lock()
	g.calls = append(g.calls, ids)
	g.mu.Unlock()
	if g.whole != nil && len(msgs) > 1 && len(failed) > 0 {
		return g.whole
	}
	if len(failed) > 0 {
		return &sdk.PublishError{Failed: failed}
	}
	return nil
}

func TestAsyncPoolBatchesWhileBusy(t *testing.T) {
	g := &gatePublisher{gate: make(chan struct{})}
	ap := sdk.NewAsyncPublisher(g, sdk.AsyncOptions{MaxInFlight: 100, MaxBatch: 10, Senders: 1})
	defer func() { _ = ap.Close() }()
	ctx := context.Background()
	var results []*sdk.PublishResult
	for i := range 31 {
		res, err := ap.PublishAsync(ctx, "q", &sdk.Message{Type: "t", Body: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	close(g.gate) // the one sender was blocked on the first message's call
	for _, r := range results {
		if err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	// The first call took what had arrived (at least one); the 30 or so
	// queued behind it went in calls of at most 10, in order.
	var flat []string
	for _, c := range g.calls {
		if len(c) > 10 {
			t.Errorf("call of %d messages, MaxBatch 10", len(c))
		}
		flat = append(flat, c...)
	}
	if len(flat) != 31 || len(g.calls) > 5 {
		t.Fatalf("%d messages in %d calls, want 31 in at most 5", len(flat), len(g.calls))
	}
	for i, r := range results {
		if flat[i] != r.ID() {
			t.Fatalf("message %d published as %s, want %s: order not kept", i, flat[i], r.ID())
		}
	}
}

func TestAsyncPoolErrorsPerMessage(t *testing.T) {
	bad := errors.New("refused")
	for _, whole := range []error{nil, fmt.Errorf("%w: bad body", sdk.ErrInvalidMessage)} {
		g := &gatePublisher{gate: make(chan struct{}), whole: whole, fail: func(m *sdk.Message) error {
			if string(m.Body) == "bad" {
				return bad
			}
			return nil
		}}
		ap := sdk.NewAsyncPublisher(g, sdk.AsyncOptions{Senders: 1})
		ctx := context.Background()
		var results []*sdk.PublishResult
		for _, body := range []string{"hold", "a", "bad", "b"} {
			res, err := ap.PublishAsync(ctx, "q", &sdk.Message{Type: "t", Body: []byte(body)})
			if err != nil {
				t.Fatal(err)
			}
			results = append(results, res)
		}
		close(g.gate)
		for i, r := range results {
			err := r.Wait(ctx)
			if (i == 2) != (err != nil) {
				t.Errorf("whole=%v: result %d: %v", whole, i, err)
			}
		}
		if err := ap.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAsyncPoolBackPressure(t *testing.T) {
	g := &gatePublisher{gate: make(chan struct{})}
	ap := sdk.NewAsyncPublisher(g, sdk.AsyncOptions{MaxInFlight: 2, Senders: 1})
	ctx := context.Background()
	var results []*sdk.PublishResult
	for range 2 {
		res, err := ap.PublishAsync(ctx, "q", &sdk.Message{Type: "t"})
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := ap.PublishAsync(short, "q", &sdk.Message{Type: "t"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PublishAsync beyond MaxInFlight: %v, want it to block until ctx ends", err)
	}
	close(g.gate)
	for _, r := range results {
		if err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ap.PublishAsync(ctx, "q", &sdk.Message{Type: "t"}); err != nil {
		t.Fatalf("after the confirms freed the window: %v", err)
	}
	if err := ap.Close(); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := 0; true {
		for _, c := range g.calls {
			n += len(c)
		}
		if n != 3 {
			t.Errorf("%d messages published, want 3 (the refused one never)", n)
		}
	}
}

func TestAsyncPoolCancelledWhileWaiting(t *testing.T) {
	g := &gatePublisher{gate: make(chan struct{})}
	ap := sdk.NewAsyncPublisher(g, sdk.AsyncOptions{Senders: 1})
	ctx := context.Background()
	first, err := ap.PublishAsync(ctx, "q", &sdk.Message{Type: "t"})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	queued, err := ap.PublishAsync(cctx, "q", &sdk.Message{Type: "t"})
	if err != nil {
		t.Fatal(err)
	}
	cancel() // before the sender reached it
	time.Sleep(10 * time.Millisecond)
	close(g.gate)
	if err := first.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	// Either the sender had already taken it with the first (it then
	// shares that call) or it fails unpublished with the cancellation.
	if err := queued.Wait(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("queued message whose ctx was cancelled: %v", err)
	}
	if err := ap.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestPublishResultResolvesOnce(t *testing.T) {
	r := sdk.NewPublishResult("id")
	if r.Err() != nil {
		t.Fatal("unresolved result has an error")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on an unresolved result with ctx done: %v", err)
	}
	boom := errors.New("boom")
	if !r.Resolve(boom) || r.Resolve(nil) {
		t.Fatal("Resolve: first call must count, later ones not")
	}
	if err := r.Wait(context.Background()); err != boom || r.Err() != boom {
		t.Fatalf("Wait = %v, Err = %v, want boom", err, r.Err())
	}
}

// ExampleNewAsyncPublisher keeps many messages in flight from one goroutine.
func ExampleNewAsyncPublisher() {
	var pub sdk.Publisher = &gatePublisher{} // a broker
	ap := sdk.NewAsyncPublisher(pub, sdk.AsyncOptions{MaxInFlight: 256})
	defer ap.Close()
	ctx := context.Background()
	var results []*sdk.PublishResult
	for i := range 1000 {
		res, err := ap.PublishAsync(ctx, "emails", &sdk.Message{Type: "email.send", Body: []byte(fmt.Sprint(i))})
		if err != nil {
			fmt.Println("not published:", err)
			return
		}
		results = append(results, res)
	}
	failed := 0
	for _, res := range results {
		if res.Wait(ctx) != nil {
			failed++ // publish it again: consumers dedupe
		}
	}
	fmt.Println("failed:", failed)
	// Output: failed: 0
}

// TestPublishResultAfterResolve: a callback registered before Resolve runs
// once Done is closed, with the outcome; one registered after runs at once.
func TestPublishResultAfterResolve(t *testing.T) {
	r := sdk.NewPublishResult("id")
	boom := errors.New("boom")
	var got []error
	r.AfterResolve(func(err error) {
		select {
		case <-r.Done():
		default:
			t.Error("callback ran before Done closed")
		}
		got = append(got, err)
	})
	if len(got) != 0 {
		t.Fatal("callback ran before Resolve")
	}
	r.Resolve(boom)
	r.Resolve(nil)
	r.AfterResolve(func(err error) { got = append(got, err) })
	if len(got) != 2 || got[0] != boom || got[1] != boom {
		t.Fatalf("callbacks got %v, want boom twice", got)
	}
	// Racing Resolve: every callback runs exactly once.
	for range 100 {
		r := sdk.NewPublishResult("id")
		var n sync.WaitGroup
		var calls sync.Map
		n.Add(2)
		go func() { defer n.Done(); r.Resolve(nil) }()
		go func() {
			defer n.Done()
			for i := range 10 {
				r.AfterResolve(func(error) {
					if _, dup := calls.LoadOrStore(i, true); dup {
						t.Error("callback ran twice")
					}
				})
			}
		}()
		n.Wait()
		for i := range 10 {
			if _, ok := calls.Load(i); !ok {
				t.Fatalf("callback %d never ran", i)
			}
		}
	}
}
