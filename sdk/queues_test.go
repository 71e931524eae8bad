package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// countingSub wraps a Subscriber and records, per queue, the Receive calls
// and the order in which deliveries came back.
type countingSub struct {
	sdk.Subscriber
	mu    sync.Mutex
	calls map[string]int
	order []string // the queue of each delivery received, in order
	seen  chan struct{}
}

func newCountingSub(s sdk.Subscriber) *countingSub {
	return &countingSub{Subscriber: s, calls: map[string]int{}, seen: make(chan struct{}, 1)}
}

func (c *countingSub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	c.mu.Lock()
	c.calls[queue]++
	c.mu.Unlock()
	ds, err := c.Subscriber.Receive(ctx, queue, max)
	c.mu.Lock()
	for range ds {
		c.order = append(c.order, queue)
	}
	c.mu.Unlock()
	if len(ds) > 0 {
		select {
		case c.seen <- struct{}{}:
		default:
		}
	}
	return ds, err
}

// received returns how many deliveries of each queue came back.
func (c *countingSub) received() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := map[string]int{}
	for _, q := range c.order {
		n[q]++
	}
	return n
}

// waitReceived waits until at least n deliveries in all were received.
func (c *countingSub) waitReceived(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		c.mu.Lock()
		if len(c.order) >= n {
			out := append([]string(nil), c.order...)
			c.mu.Unlock()
			return out
		}
		c.mu.Unlock()
		select {
		case <-c.seen:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("fewer than %d deliveries after 30s: %v", n, c.received())
		}
	}
}

func fill(t *testing.T, b sdk.Publisher, queue string, n int) {
	t.Helper()
	for i := 0; i < n; i += 100 {
		batch := make([]*sdk.Message, 0, 100)
		for j := i; j < min(n, i+100); j++ {
			batch = append(batch, &sdk.Message{Type: "t", Body: fmt.Appendf(nil, "%s-%d", queue, j)})
		}
		if err := b.Publish(context.Background(), queue, batch...); err != nil {
			t.Fatal(err)
		}
	}
}

// runMQ runs w until the returned stop is called.
func runMQ(t *testing.T, w *sdk.Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func mqQuiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newMem(t *testing.T) *memory.Broker {
	t.Helper()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// Acceptance: weights 3:1, both queues full → receives split within 10% of
// 3:1.
func TestWorkerQueuesWeighted(t *testing.T) {
	for _, conc := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("concurrency=%d", conc), func(t *testing.T) {
			b := newMem(t)
			fill(t, b, "hi", 3000)
			fill(t, b, "lo", 3000)
			sub := newCountingSub(b)
			ok := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
			// QueueIdleWait long: a machine stalled for the default 500ms would
			// make a full queue look idle, which is not what this test is about.
			w, err := sdk.NewWorker(sub, ok, sdk.WorkerOptions{Concurrency: conc, Logger: mqQuiet(), QueueIdleWait: 10 * time.Second,
				Queues: []sdk.WorkerQueue{{Name: "hi", Weight: 3}, {Name: "lo", Weight: 1}}})
			if err != nil {
				t.Fatal(err)
			}
			stop := runMQ(t, w)
			order := sub.waitReceived(t, 2000) // both queues still full: hi at most 1500+capacity of 3000
			stop()
			hi, lo := 0, 0
			for _, q := range order[:2000] {
				if q == "hi" {
					hi++
				} else {
					lo++
				}
			}
			ratio := float64(hi) / float64(lo)
			t.Logf("first 2000 receives: hi %d, lo %d, ratio %.3f", hi, lo, ratio)
			if ratio < 2.7 || ratio > 3.3 {
				for k := 0; k < 2000; k += 100 {
					h := 0
					for _, q := range order[k : k+100] {
						if q == "hi" {
							h++
						}
					}
					t.Logf("window %d: hi %d", k, h)
				}
				t.Errorf("hi:lo = %d:%d = %.3f, want within 10%% of 3", hi, lo, ratio)
			}
		})
	}
}

// With Priority, a lower queue gets nothing while the first has work.
func TestWorkerQueuesPriority(t *testing.T) {
	b := newMem(t)
	fill(t, b, "urgent", 500)
	fill(t, b, "bulk", 200)
	sub := newCountingSub(b)
	ok := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	// QueueIdleWait 2s, not the default 500ms: a receive of urgent stalled
	// that long on a loaded machine would come back empty, mark urgent dry
	// and give bulk a slot while urgent still had work. It costs the test
	// one wait once urgent is really dry.
	w, err := sdk.NewWorker(sub, ok, sdk.WorkerOptions{Concurrency: 4, Logger: mqQuiet(), Priority: true,
		QueueIdleWait: 2 * time.Second, Queues: []sdk.WorkerQueue{{Name: "urgent"}, {Name: "bulk"}}})
	if err != nil {
		t.Fatal(err)
	}
	runMQ(t, w)
	order := sub.waitReceived(t, 700)
	for i, q := range order[:500] {
		if q != "urgent" {
			t.Fatalf("delivery %d came from %s while urgent still had work", i, q)
		}
	}
}

// A queue that runs dry gives its slot back within QueueIdleWait, however
// few slots its receive loop holds. Before, a loop holding one slot waited
// in an unbounded Receive of one on the empty queue: with Concurrency 1 the
// other queue never ran, and with Priority a busy queue that ran dry while
// its loop held one slot still counted as busy, so the allocator handed it
// every slot that came free (a CI run: 500 urgent, 0 of 200 bulk in 30 s).
func TestWorkerQueuesDryQueueYields(t *testing.T) {
	for _, priority := range []bool{false, true} {
		t.Run(fmt.Sprintf("priority=%v", priority), func(t *testing.T) {
			b := newMem(t)
			fill(t, b, "bulk", 3)
			sub := newCountingSub(b)
			ok := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
			w, err := sdk.NewWorker(sub, ok, sdk.WorkerOptions{Concurrency: 1, Logger: mqQuiet(), Priority: priority,
				QueueIdleWait: 20 * time.Millisecond, Queues: []sdk.WorkerQueue{{Name: "urgent"}, {Name: "bulk"}}})
			if err != nil {
				t.Fatal(err)
			}
			runMQ(t, w)
			sub.waitReceived(t, 3)
			fill(t, b, "urgent", 2)
			if got := sub.waitReceived(t, 5); got[3] != "urgent" || got[4] != "urgent" {
				t.Errorf("deliveries in order %v, want the two urgent ones last", got)
			}
		})
	}
}

// An idle queue polling with one slot does not take the last free slot as
// a waiting one while another queue has work and nothing to receive with.
// Before, at Concurrency 1 (two slots) the empty queue held both (one in its
// Receive, one waiting) and the queue with work ran one job per
// QueueIdleWait: 20 jobs took 19 QueueIdleWaits.
func TestWorkerQueuesIdleQueueLeavesLastSlot(t *testing.T) {
	const idleWait = time.Second
	for _, priority := range []bool{false, true} {
		t.Run(fmt.Sprintf("priority=%v", priority), func(t *testing.T) {
			b := newMem(t)
			sub := newCountingSub(b)
			ok := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
			w, err := sdk.NewWorker(sub, ok, sdk.WorkerOptions{Concurrency: 1, Logger: mqQuiet(), Priority: priority,
				QueueIdleWait: idleWait, Queues: []sdk.WorkerQueue{{Name: "empty"}, {Name: "busy"}}})
			if err != nil {
				t.Fatal(err)
			}
			runMQ(t, w)
			// Both queues start active; wait until both ran dry once (idle).
			deadline := time.Now().Add(30 * time.Second)
			for {
				sub.mu.Lock()
				idle := sub.calls["empty"] >= 2 && sub.calls["busy"] >= 2
				sub.mu.Unlock()
				if idle {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the queues never went idle")
				}
				time.Sleep(10 * time.Millisecond)
			}
			fill(t, b, "busy", 20)
			// A bound, not a timing: the fixed Worker takes milliseconds,
			// the broken one 19 QueueIdleWaits.
			bound := time.After(5 * idleWait)
			for {
				if n := sub.received()["busy"]; n >= 20 {
					break
				}
				select {
				case <-sub.seen:
				case <-time.After(10 * time.Millisecond):
				case <-bound:
					t.Fatalf("%d of 20 jobs of the busy queue received in 5 QueueIdleWaits: the empty queue held the slots", sub.received()["busy"])
				}
			}
		})
	}
}

// An empty queue does not hold the Worker back: its Receive waits on its
// own while the other queue's work flows.
func TestWorkerQueuesEmptyQueueDoesNotBlock(t *testing.T) {
	b := newMem(t)
	fill(t, b, "busy", 300)
	sub := newCountingSub(b)
	ok := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	w, err := sdk.NewWorker(sub, ok, sdk.WorkerOptions{Concurrency: 2, Logger: mqQuiet(),
		Queues: []sdk.WorkerQueue{{Name: "empty", Weight: 9}, {Name: "busy", Weight: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	runMQ(t, w)
	sub.waitReceived(t, 300)
	fill(t, b, "empty", 5)
	if got := sub.waitReceived(t, 305); got[len(got)-1] != "empty" {
		t.Errorf("last delivery from %s", got[len(got)-1])
	}
}

// Acceptance: a paused queue gets no new Receive — a Receive waiting on it
// is interrupted — while held work is untouched; it resumes cleanly.
func TestWorkerPauseResume(t *testing.T) {
	for _, queues := range [][]sdk.WorkerQueue{
		{{Name: "a"}}, // the single-queue path
		{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, // the multi-queue path
	} {
		t.Run(fmt.Sprintf("queues=%d", len(queues)), func(t *testing.T) {
			b := newMem(t)
			sub := newCountingSub(b)
			release := make(chan struct{})
			started := make(chan string, 100)
			var mu sync.Mutex
			done := map[string]int{}
			h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
				body := string(d.Message().Body)
				started <- body
				if body == "a-held" {
					<-release
				}
				mu.Lock()
				done[d.Queue()]++
				mu.Unlock()
				return nil
			})
			w, err := sdk.NewWorker(sub, h, sdk.WorkerOptions{Concurrency: 4, Logger: mqQuiet(), Queues: queues})
			if err != nil {
				t.Fatal(err)
			}
			runMQ(t, w)
			// a holds one job that is running when the queue is paused.
			if err := b.Publish(context.Background(), "a", &sdk.Message{Type: "t", Body: []byte("a-held")}); err != nil {
				t.Fatal(err)
			}
			if got := <-started; got != "a-held" {
				t.Fatalf("started %s", got)
			}
			// Let a's receiver wait in a Receive on the empty queue, then pause.
			waitCalls(t, sub, "a", 2)
			if err := w.Pause("a"); err != nil {
				t.Fatal(err)
			}
			if !w.Paused("a") {
				t.Fatal("Paused(a) = false")
			}
			time.Sleep(20 * time.Millisecond) // the interrupted Receive returns
			sub.mu.Lock()
			callsAtPause := sub.calls["a"]
			sub.mu.Unlock()
			fill(t, b, "a", 10)
			if len(queues) > 1 {
				fill(t, b, "b", 10) // the other queue keeps flowing
				for range 10 {
					<-started
				}
			}
			close(release) // the held job finishes and is acked while paused
			deadline := time.Now().Add(10 * time.Second)
			for {
				mu.Lock()
				n := done["a"]
				mu.Unlock()
				if n == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("held job did not finish while paused")
				}
				time.Sleep(time.Millisecond)
			}
			// The handler counted the job before the Worker acked it: wait
			// for the ack, so that the Stats below see it settled.
			for {
				st, err := b.Stats(context.Background(), "a")
				if err != nil {
					t.Fatal(err)
				}
				if st.InFlight == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("held job not acked while paused: %+v", st)
				}
				time.Sleep(time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond) // room for a wrong Receive to happen
			sub.mu.Lock()
			callsPaused := sub.calls["a"]
			sub.mu.Unlock()
			if callsPaused != callsAtPause {
				t.Errorf("%d Receive calls on paused a (%d at pause)", callsPaused-callsAtPause, callsAtPause)
			}
			if got := sub.received()["a"]; got != 1 {
				t.Errorf("%d deliveries of a received, want only the held one", got)
			}
			st, err := b.Stats(context.Background(), "a")
			if err != nil {
				t.Fatal(err)
			}
			if st.Ready != 10 || st.InFlight != 0 {
				t.Errorf("paused a: %+v, want 10 ready, none in flight", st)
			}

			if err := w.Resume("a"); err != nil {
				t.Fatal(err)
			}
			if err := w.Resume("a"); err != nil { // idempotent
				t.Fatal(err)
			}
			for range 10 {
				select {
				case <-started:
				case <-time.After(10 * time.Second):
					t.Fatal("a did not resume")
				}
			}
		})
	}
}

// Pause before Run starts the Worker with the queue paused.
func TestWorkerPauseBeforeRun(t *testing.T) {
	b := newMem(t)
	fill(t, b, "x", 3)
	fill(t, b, "y", 3)
	sub := newCountingSub(b)
	ok := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	w, err := sdk.NewWorker(sub, ok, sdk.WorkerOptions{Logger: mqQuiet(), Queues: []sdk.WorkerQueue{{Name: "x"}, {Name: "y"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Pause("x"); err != nil {
		t.Fatal(err)
	}
	if h := w.Health(); len(h.Paused) != 1 || h.Paused[0] != "x" {
		t.Errorf("Health().Paused = %v, want [x]", h.Paused)
	}
	runMQ(t, w)
	sub.waitReceived(t, 3)
	time.Sleep(20 * time.Millisecond)
	if got := sub.received(); got["x"] != 0 || got["y"] != 3 {
		t.Errorf("received %v, want y only", got)
	}
	if err := w.Resume("x"); err != nil {
		t.Fatal(err)
	}
	sub.waitReceived(t, 6)
}

func TestWorkerQueuesValidation(t *testing.T) {
	b := newMem(t)
	ok := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	for name, o := range map[string]sdk.WorkerOptions{
		"both":     {Queue: "a", Queues: []sdk.WorkerQueue{{Name: "b"}}},
		"twice":    {Queues: []sdk.WorkerQueue{{Name: "a"}, {Name: "a"}}},
		"negative": {Queues: []sdk.WorkerQueue{{Name: "a", Weight: -1}}},
		"bad name": {Queues: []sdk.WorkerQueue{{Name: "a b"}}},
		"none":     {},
	} {
		if _, err := sdk.NewWorker(b, ok, o); !errors.Is(err, sdk.ErrInvalidQueue) {
			t.Errorf("%s: %v, want ErrInvalidQueue", name, err)
		}
	}
	w, err := sdk.NewWorker(b, ok, sdk.WorkerOptions{Queues: []sdk.WorkerQueue{{Name: "a"}, {Name: "b", Weight: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Pause("c"); !errors.Is(err, sdk.ErrUnknownQueue) || !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("Pause(c) = %v", err)
	}
	if err := w.Resume("c"); !errors.Is(err, sdk.ErrUnknownQueue) {
		t.Errorf("Resume(c) = %v", err)
	}
	if w.Health().Queue != "a,b" {
		t.Errorf("Health().Queue = %q", w.Health().Queue)
	}
}

func waitCalls(t *testing.T, sub *countingSub, queue string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sub.mu.Lock()
		got := sub.calls[queue]
		sub.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Receive calls on %s, want %d", got, queue, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// longPollQueues is a LongPoller over the memory broker whose Receive on an
// empty queue waits its long poll (wait) and returns nothing, like SQS; it
// counts the polls of the queue named idle whose context ended first. (The
// busy queue's Receives of several are bounded by QueueIdleWait by design,
// and under load one can run past the test's 20 ms.)
type longPollQueues struct {
	*memory.Broker
	wait time.Duration
	cut  atomic.Int64
}

func (s *longPollQueues) ReceiveWait() time.Duration { return s.wait }

func (s *longPollQueues) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	// The poll runs to its own end whatever the caller does, as an HTTP
	// long poll does on the server.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.wait)
	defer cancel()
	ds, err := s.Broker.Receive(pctx, queue, max)
	if ctx.Err() != nil {
		if queue == "idle" {
			s.cut.Add(1) // the caller gave up during the poll
		}
		return nil, ctx.Err()
	}
	if err != nil && pctx.Err() != nil {
		return nil, nil // the long poll ran out: empty
	}
	return ds, err
}

// On a LongPoller, a multi-queue Worker leaves an idle queue's poll of one
// to end by itself instead of cutting it at QueueIdleWait: a poll cut short
// may have taken messages on the server (SQS), which then come back a
// visibility timeout later with a receive counted. The other queue still
// gets its slot between polls. Each queue starts with a poll of one: a
// first poll of several on the idle queue would be cut (1 run in 20 did
// when every queue started wanting a share of the slots).
func TestWorkerQueuesLongPollNotCut(t *testing.T) {
	sub := &longPollQueues{Broker: newMem(t), wait: 200 * time.Millisecond}
	fill(t, sub.Broker, "busy", 5)
	var handled atomic.Int64
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { handled.Add(1); return nil })
	w, err := sdk.NewWorker(sub, h, sdk.WorkerOptions{Concurrency: 1, Logger: mqQuiet(), QueueIdleWait: 20 * time.Millisecond,
		Queues: []sdk.WorkerQueue{{Name: "idle"}, {Name: "busy"}}})
	if err != nil {
		t.Fatal(err)
	}
	stop := runMQ(t, w)
	for deadline := time.Now().Add(20 * time.Second); handled.Load() < 5; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 5 handled in 20s", handled.Load())
		}
	}
	time.Sleep(500 * time.Millisecond) // a few idle polls of both queues
	if n := sub.cut.Load(); n > 0 {
		t.Errorf("%d long polls of the idle queue cut before they ended, want none", n)
	}
	stop()
}

// stoppingSub is a fakeSub that is a ReceiveStopper: it reports each
// StopReceiving with whether the last Receive's ctx was done by then.
type stoppingSub struct {
	*fakeSub
	mu      sync.Mutex
	last    context.Context
	stopped chan string
}

func (s *stoppingSub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	s.mu.Lock()
	s.last = ctx
	s.mu.Unlock()
	return s.fakeSub.Receive(ctx, queue, max)
}

func (s *stoppingSub) StopReceiving(ctx context.Context, queue string) error {
	s.mu.Lock()
	interrupted := s.last != nil && s.last.Err() != nil
	s.mu.Unlock()
	s.stopped <- fmt.Sprintf("%s interrupted=%v", queue, interrupted)
	return nil
}

// Pause asks a ReceiveStopper to hand back what it took in ahead of
// Receive (RabbitMQ's prefetch, held unacked in the paused process for the
// whole pause before), after interrupting the Receive waiting on the
// queue, so that the broker does not see that Receive as wanting messages.
func TestWorkerPauseStopsBrokerReceiving(t *testing.T) {
	sub := &stoppingSub{fakeSub: newFakeSub(), stopped: make(chan string, 4)}
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "q", Logger: mqQuiet()})
	if err != nil {
		t.Fatal(err)
	}
	runMQ(t, w)
	<-sub.receiving
	for range 2 {
		if err := w.Pause("q"); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-sub.stopped:
			if got != "q interrupted=true" {
				t.Errorf("StopReceiving: %s", got)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Pause did not call StopReceiving")
		}
		if err := w.Resume("q"); err != nil {
			t.Fatal(err)
		}
		<-sub.receiving
	}
}

// blockingStopSub is a fakeSub whose StopReceiving waits for its ctx, as a
// broker's does while its hand-back cannot finish (a server that does not
// answer): it reports each call's start and return.
type blockingStopSub struct {
	*fakeSub
	entered  chan struct{}
	returned chan error
}

func (s *blockingStopSub) StopReceiving(ctx context.Context, queue string) error {
	s.entered <- struct{}{}
	<-ctx.Done()
	s.returned <- ctx.Err()
	return ctx.Err()
}

// The StopReceiving that Pause starts in the background has an owner: Run
// cancels it and waits for it before returning (the caller closes the
// broker next), and Resume stops waiting for it. Before, it was left
// running up to a minute after both, with no one to wait for it.
func TestWorkerPauseStopReceivingOwned(t *testing.T) {
	sub := &blockingStopSub{fakeSub: newFakeSub(), entered: make(chan struct{}, 4), returned: make(chan error, 4)}
	w, err := sdk.NewWorker(sub, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "q", Logger: mqQuiet()})
	if err != nil {
		t.Fatal(err)
	}
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal(what)
		}
	}

	// Resume: the call is cancelled.
	if err := w.Pause("q"); err != nil {
		t.Fatal(err)
	}
	wait(sub.entered, "Pause did not call StopReceiving")
	if err := w.Resume("q"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-sub.returned:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("StopReceiving after Resume returned %v, want its ctx cancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("StopReceiving still waited after Resume")
	}

	// End of Run: the call has returned once Run has.
	stop := runMQ(t, w)
	<-sub.receiving
	if err := w.Pause("q"); err != nil {
		t.Fatal(err)
	}
	wait(sub.entered, "Pause did not call StopReceiving")
	stop()
	select {
	case <-sub.returned:
	default:
		t.Fatal("Run returned with the StopReceiving its Pause started still running")
	}
}
