package sdk

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
)

// fullBatchReceiver is a ReceiveBatcher (SQS-like: at most batch a call)
// on a queue that always has work. Its first Receive hands the queue one
// more slot, as the allocator would meanwhile; later ones report the max
// they were asked for on second and wait for the end.
type fullBatchReceiver struct {
	batch  int
	calls  atomic.Int32
	slots  chan int
	second chan int
}

func (s *fullBatchReceiver) ReceiveBatch() int { return s.batch }

func (s *fullBatchReceiver) Receive(ctx context.Context, _ string, max int) ([]Delivery, error) {
	if s.calls.Add(1) > 1 {
		s.second <- max
		<-ctx.Done()
		return nil, ctx.Err()
	}
	s.slots <- 99
	ds := make([]Delivery, min(max, s.batch))
	for i := range ds {
		ds[i] = stubDelivery{m: &Message{ID: NewID(), Type: "t"}}
	}
	return ds, nil
}

// TestQueueFullBatchStaysActive: with several Queues on a ReceiveBatcher, a
// Receive that returned a full batch found work, not an idle queue. Handed
// more slots than a batch, the loop asked for all of them, took the full
// batch as a short Receive and made the queue idle (one slot at a time):
// on SQS every other poll of a busy queue asked for one message.
func TestQueueFullBatchStaysActive(t *testing.T) {
	const capacity = 8
	sub := &fullBatchReceiver{batch: 2, second: make(chan int, 1)}
	w, err := NewWorker(sub, HandlerFunc(func(context.Context, Delivery) error { return nil }), WorkerOptions{
		Queues: []WorkerQueue{{Name: "a"}, {Name: "b"}}, Concurrency: 4, Prefetch: 4,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	free := make(chan int, capacity)
	held := make([]atomic.Pointer[task], capacity+100)
	q := w.queue("a")
	q.slots = make(chan int, capacity)
	sub.slots = q.slots
	q.want.Store(capacity)
	for i := range 4 {
		q.slots <- i
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q.begin(ctx)
	defer q.end()
	done := make(chan error, 1)
	go func() { done <- w.receive(ctx, q, q.slots, free, newRunQueue(capacity+100), nil, held) }()
	max := <-sub.second
	if want := q.want.Load(); want == 1 || max == 1 {
		t.Errorf("after a full batch of %d the queue wants %d slot(s) and its next Receive asked for %d: taken as idle", sub.batch, want, max)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("receive: %v", err)
	}
}
