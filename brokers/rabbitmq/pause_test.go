package rabbitmq

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestPauseHandsBackPrefetched: a Worker paused on a queue must not keep
// the messages its consumer prefetched (delivered to this process, unacked,
// held by no handler) for the whole pause. Before, the consumer went on
// holding up to Prefetch of them — unacked, so no other consumer could have
// them and they looked in flight — until the Worker resumed or its broker
// closed. Now Pause hands them back without counting an attempt: another
// consumer gets them at Attempt() 1 while the Worker is paused, none is
// lost or delivered twice, and the Worker consumes again after Resume.
func TestPauseHandsBackPrefetched(t *testing.T) {
	const n, prefetch = 10, 10
	url, q, b := brokerOnQueue(t, Options{Prefetch: prefetch, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pub := newBroker(t, url, Options{Logger: quiet})
	if err := pub.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	published := map[string]bool{}
	for range n {
		m := &sdk.Message{Type: "t", Body: []byte("x")}
		if err := pub.Publish(ctx, q, m); err != nil {
			t.Fatal(err)
		}
		published[m.ID] = true
	}
	var (
		mu      sync.Mutex
		handled = map[string]int{}
		late    []int
	)
	started := make(chan struct{}, n+1)
	release := make(chan struct{})
	var releaseOnce sync.Once
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		started <- struct{}{}
		<-release
		mu.Lock()
		handled[d.Message().ID]++
		if d.Attempt() != 1 {
			late = append(late, d.Attempt())
		}
		mu.Unlock()
		return nil
	})
	// One handler and one waiting slot: the Worker holds 1 or 2, the
	// consumer the rest.
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: q, Concurrency: 1, Prefetch: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() {
		releaseOnce.Do(func() { close(release) })
		stop()
		<-done
	}()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the Worker ran nothing")
	}
	if err := w.Pause(q); err != nil {
		t.Fatal(err)
	}

	// Another consumer gets what the paused Worker does not hold: at least
	// n-2 (the Worker holds one or two: a Receive returns what has arrived).
	other := newBroker(t, url, Options{Prefetch: prefetch, Logger: quiet})
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	got := map[string]bool{}
	receive := func(ctx context.Context) error {
		ds, err := other.Receive(ctx, q, n)
		for _, d := range ds {
			id := d.Message().ID
			if !published[id] || got[id] {
				t.Fatalf("other consumer: unexpected or repeated message %s", id)
			}
			if d.Attempt() != 1 {
				t.Errorf("message %s handed back at attempt %d, want 1", id, d.Attempt())
			}
			got[id] = true
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return err
	}
	for len(got) < n-2 {
		if err := receive(rctx); err != nil {
			t.Fatalf("while the Worker was paused another consumer got %d of the %d messages it does not hold: %v", len(got), n-2, err)
		}
	}

	// The Worker runs what it held, at attempt 1; the other consumer has
	// the rest: each message once.
	releaseOnce.Do(func() { close(release) })
	for {
		mu.Lock()
		k := len(handled)
		mu.Unlock()
		if k+len(got) == n {
			break
		}
		if k+len(got) > n || rctx.Err() != nil {
			t.Fatalf("Worker ran %d, other consumer got %d, of %d", k, len(got), n)
		}
		short, cancel := context.WithTimeout(rctx, 100*time.Millisecond)
		if err := receive(short); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		cancel()
	}
	mu.Lock()
	for id, c := range handled {
		if got[id] || !published[id] || c != 1 {
			t.Errorf("Worker: message %s handled %d times (also by the other consumer: %v)", id, c, got[id])
		}
	}
	if len(late) > 0 {
		t.Errorf("Worker ran held messages at attempts %v, want 1", late)
	}
	mu.Unlock()
	// Closed, so that its consumer does not take the message published
	// below.
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}

	// After Resume the Worker consumes again.
	m := &sdk.Message{Type: "t", Body: []byte("after")}
	if err := pub.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	if err := w.Resume(q); err != nil {
		t.Fatal(err)
	}
	for {
		mu.Lock()
		c := handled[m.ID]
		mu.Unlock()
		if c == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the Worker did not consume after Resume")
		case <-time.After(10 * time.Millisecond):
		}
	}
}
