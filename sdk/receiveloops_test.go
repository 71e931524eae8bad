package sdk_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// slowReceiver makes every Receive a slow round trip (an SQS long poll that
// returns little) and records how many run at once.
type slowReceiver struct {
	sdk.Broker
	now, peak atomic.Int64
}

func (s *slowReceiver) Receive(ctx context.Context, q string, max int) ([]sdk.Delivery, error) {
	n := s.now.Add(1)
	defer s.now.Add(-1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	select {
	case <-time.After(5 * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Broker.Receive(ctx, q, min(max, 2))
}

func TestWorkerReceiveLoops(t *testing.T) {
	for _, loops := range []int{1, 4} {
		br, err := memory.New(memory.Options{})
		if err != nil {
			t.Fatal(err)
		}
		const n = 200
		for range n / 100 {
			batch := make([]*sdk.Message, 100)
			for i := range batch {
				batch[i] = &sdk.Message{Type: "t"}
			}
			if err := br.Publish(context.Background(), "q", batch...); err != nil {
				t.Fatal(err)
			}
		}
		sub := &slowReceiver{Broker: br}
		var mu sync.Mutex
		seen := map[string]int{}
		done := make(chan struct{})
		w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			seen[d.Message().ID]++
			if len(seen) == n {
				select {
				case <-done:
				default:
					close(done)
				}
			}
			return nil
		}), sdk.WorkerOptions{Queue: "q", Concurrency: 8, ReceiveLoops: loops, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- w.Run(ctx) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("loops %d: %d of %d handled", loops, len(seen), n)
		}
		cancel()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		for id, c := range seen {
			if c != 1 {
				t.Errorf("loops %d: message %s handled %d times", loops, id, c)
			}
		}
		if peak := sub.peak.Load(); (loops == 1) != (peak == 1) || peak > int64(loops) {
			t.Errorf("ReceiveLoops %d: at most %d Receive calls at once, want %d", loops, peak, loops)
		}
		_ = br.Close()
	}
	if _, err := sdk.NewWorker(&slowReceiver{}, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "q", ReceiveLoops: -1}); err == nil {
		t.Error("NewWorker accepted ReceiveLoops -1")
	}
}
