package brokertest

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// settlements is an sdk.Observer that counts, by message ID, the settlements
// the Worker made successfully.
type settlements struct {
	mu      sync.Mutex
	acked   map[string]int
	dead    map[string]int
	failed  map[string]int // settlement calls that returned an error
	retries int
	final   int // successful acks and dead letters
	changed chan struct{}
}

func newSettlements() *settlements {
	return &settlements{acked: map[string]int{}, dead: map[string]int{}, failed: map[string]int{}, changed: make(chan struct{}, 1)}
}

func (s *settlements) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (s *settlements) Settled(_ context.Context, d sdk.Delivery, st sdk.Settlement) {
	id := d.Message().ID
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.Err != nil {
		s.failed[id]++
		return
	}
	switch st.Action {
	case sdk.ActionAck:
		s.acked[id]++
		s.final++
	case sdk.ActionDeadLetter:
		s.dead[id]++
		s.final++
	case sdk.ActionRetry:
		s.retries++
	}
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// finals returns the number of successful acks and dead letters.
func (s *settlements) finals() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.final
}

// waitFinals waits until n messages were acked or dead-lettered.
func (s *settlements) waitFinals(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for s.finals() < n {
		select {
		case <-s.changed:
		case <-deadline.C:
			t.Fatalf("%d of %d messages acked or dead-lettered after %s", s.finals(), n, timeout)
		}
	}
}

// publishMany publishes n messages in batches and returns their IDs.
func (e *env) publishMany(t *testing.T, n int, typ string) []string {
	t.Helper()
	const batch = 500
	ids := make([]string, 0, n)
	for len(ids) < n {
		k := min(batch, n-len(ids))
		msgs := make([]*sdk.Message, k)
		for i := range msgs {
			msgs[i] = &sdk.Message{Type: typ, Body: []byte(strconv.Itoa(len(ids) + i))}
		}
		e.publish(t, msgs...)
		for _, m := range msgs {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// workerTimeout bounds a Worker-level run of n messages.
func (e *env) workerTimeout(n int) time.Duration {
	return e.h.Timeout + time.Duration(n)*time.Millisecond
}

// startWorker runs w until the returned stop function is called; stop
// cancels Run's context, waits for Run and checks its error.
func startWorker(t *testing.T, w *sdk.Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Worker.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (e *env) workerOptions(obs sdk.Observer, seed uint64) sdk.WorkerOptions {
	return sdk.WorkerOptions{
		Queue:       e.q,
		Concurrency: 16,
		Lease:       e.h.Lease,
		Retry: sdk.RetryPolicy{
			MaxAttempts: 3,
			Backoff:     sdk.Backoff{Base: time.Millisecond, Max: 20 * time.Millisecond},
		},
		DrainTimeout: e.h.Timeout / 2,
		Observers:    []sdk.Observer{obs},
		Logger:       slog.New(slog.DiscardHandler),
		Rand:         rand.New(rand.NewPCG(seed, seed+1)),
	}
}

func testWorkerRandomFailures(t *testing.T, e *env) {
	n := e.h.WorkerMessages
	ids := e.publishMany(t, n, "brokertest.worker")
	var (
		mu  sync.Mutex
		rng = rand.New(rand.NewPCG(42, 7))
	)
	handler := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		mu.Lock()
		fail := rng.Float64() < 0.2
		mu.Unlock()
		if fail {
			return errBoom
		}
		return nil
	})
	obs := newSettlements()
	w, err := sdk.NewWorker(e.b, handler, e.workerOptions(obs, 1))
	if err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	stop := startWorker(t, w)
	obs.waitFinals(t, n, e.workerTimeout(n))
	stop()

	obs.mu.Lock()
	defer obs.mu.Unlock()
	dead := 0
	for _, id := range ids {
		a, d := obs.acked[id], obs.dead[id]
		if a+d != 1 {
			t.Errorf("message %s: acked %d times, dead-lettered %d times; want exactly one of them once", id, a, d)
		}
		dead += d
	}
	if obs.final != n {
		t.Errorf("%d acks and dead letters for %d messages", obs.final, n)
	}
	if len(obs.failed) > 0 {
		t.Logf("%d messages had a settlement call fail (lease lost under load?)", len(obs.failed))
	}
	t.Logf("%d messages: %d acked, %d dead-lettered, %d retries", n, n-dead, dead, obs.retries)
	if dead == 0 || obs.retries == 0 {
		t.Errorf("%d dead letters and %d retries: the random failures did not happen", dead, obs.retries)
	}
	if e.supports(CapDeadLetters) {
		if got := e.waitDeadLetters(t, dead); len(got) != dead {
			t.Errorf("%d messages in the dead-letter queue, want %d", len(got), dead)
		}
	}
	e.expectNone(t, e.h.Lease/2)
}

func testWorkerShutdownMidway(t *testing.T, e *env) {
	n := e.h.WorkerMessages
	ids := e.publishMany(t, n, "brokertest.shutdown")
	var (
		mu      sync.Mutex
		effects = map[string]int{}
		total   int
		third   = make(chan struct{})
	)
	handler := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		mu.Lock()
		effects[d.Message().ID]++
		total++
		if total == n/3 {
			close(third)
		}
		mu.Unlock()
		return nil
	})
	obs := newSettlements()
	w1, err := sdk.NewWorker(e.b, handler, e.workerOptions(obs, 1))
	if err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	stop1 := startWorker(t, w1)
	select {
	case <-third:
	case <-time.After(e.workerTimeout(n)):
		t.Fatalf("first worker did not process a third of %d messages within %s", n, e.workerTimeout(n))
	}
	stop1() // Run returns after its drain
	first := obs.finals()
	if first >= n {
		t.Fatalf("the first worker finished all %d messages before it was stopped; raise WorkerMessages", n)
	}

	w2, err := sdk.NewWorker(e.b, handler, e.workerOptions(obs, 2))
	if err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	stop2 := startWorker(t, w2)
	obs.waitFinals(t, n, e.workerTimeout(n))
	stop2()

	obs.mu.Lock()
	defer obs.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if a := obs.acked[id]; a != 1 {
			t.Errorf("message %s acked %d times, want 1", id, a)
		}
		// A handler may run twice only if its first ack was lost.
		if c := effects[id]; c != 1 && !(c > 1 && obs.failed[id] > 0) {
			t.Errorf("message %s: handler finished %d times (%d failed settlements)", id, c, obs.failed[id])
		}
	}
	if len(obs.dead) > 0 {
		t.Errorf("%d messages dead-lettered; the handler never fails", len(obs.dead))
	}
	t.Logf("%d messages: %d settled by the first worker, the rest by the second", n, first)
	e.expectNone(t, e.h.Lease/2)
}

// testWorkerShutdownInterrupts stops a Worker whose handlers are all still
// running: after DrainTimeout their context is cancelled with
// [sdk.ErrShutdown], and the deliveries they hand back must come back
// without an attempt consumed where the broker can release (Attempt() 1
// again; at least 2 where the Worker falls back to Retry), never
// dead-lettered, and be acked once by the next Worker.
func testWorkerShutdownInterrupts(t *testing.T, e *env) {
	const n = 8 // fewer than the Worker's Concurrency: all run at once
	ids := e.publishMany(t, n, "brokertest.interrupted")
	var (
		phase   atomic.Int32 // 1: handlers block until cancelled; 2: they succeed
		mu      sync.Mutex
		started = map[string]int{}
		causes  = map[string]error{}
		second  = map[string]int{} // Attempt() seen by the second Worker
		all     = make(chan struct{})
	)
	phase.Store(1)
	handler := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		id := d.Message().ID
		if phase.Load() == 2 {
			mu.Lock()
			second[id] = d.Attempt()
			mu.Unlock()
			return nil
		}
		mu.Lock()
		started[id]++
		if len(started) == n && started[id] == 1 {
			close(all)
		}
		mu.Unlock()
		<-ctx.Done()
		mu.Lock()
		causes[id] = context.Cause(ctx)
		mu.Unlock()
		return ctx.Err()
	})
	obs := newSettlements()
	opts := e.workerOptions(obs, 3)
	opts.DrainTimeout = 100 * time.Millisecond
	w1, err := sdk.NewWorker(e.b, handler, opts)
	if err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	stop1 := startWorker(t, w1)
	select {
	case <-all:
	case <-time.After(e.h.Timeout):
		mu.Lock()
		got := len(started)
		mu.Unlock()
		t.Fatalf("%d of %d handlers started within %s", got, n, e.h.Timeout)
	}
	stop1() // cancels the handlers after DrainTimeout; Run must return nil
	phase.Store(2)

	mu.Lock()
	for _, id := range ids {
		if started[id] != 1 {
			// A second start while the first handler still ran: its lease
			// was not kept alive.
			t.Errorf("message %s started %d times by the first Worker, want 1", id, started[id])
		}
		if !errors.Is(causes[id], sdk.ErrShutdown) {
			t.Errorf("message %s: handler context cancelled with cause %v, want ErrShutdown", id, causes[id])
		}
	}
	mu.Unlock()
	if got := obs.finals(); got != 0 {
		t.Fatalf("%d messages acked or dead-lettered by the interrupted Worker, want 0", got)
	}

	w2, err := sdk.NewWorker(e.b, handler, e.workerOptions(obs, 4))
	if err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	stop2 := startWorker(t, w2)
	obs.waitFinals(t, n, e.workerTimeout(n))
	stop2()

	// With Release the attempt is given back: exactly 1. Without it the
	// Worker falls back to Retry(0), which counts one; more is allowed
	// there, because on SQS a long poll cancelled by the shutdown may still
	// be answered server-side and count a receive nobody saw.
	release := e.supports(CapRelease)
	obs.mu.Lock()
	defer obs.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if a, d := obs.acked[id], obs.dead[id]; a != 1 || d != 0 {
			t.Errorf("message %s: acked %d times, dead-lettered %d times; want acked once", id, a, d)
		}
		if got := second[id]; release && got != 1 {
			t.Errorf("message %s: Attempt() = %d after an interrupted run, want 1 (released)", id, got)
		} else if !release && got < 2 {
			t.Errorf("message %s: Attempt() = %d after an interrupted run, want at least 2 (retried)", id, got)
		}
	}
	e.expectNone(t, e.h.Lease/2)
}

// testWorkerLongJob runs handlers three times as long as the lease on two
// Workers sharing the queue: the Worker's heartbeat must keep each lease
// alive, so that no message is handed to the other Worker (or back to the
// same one) while its handler runs — the "visibility timeout shorter than
// the job" duplicate (ARCHITECTURE.md, "Attempts, leases and heartbeats").
func testWorkerLongJob(t *testing.T, e *env) {
	const n = 4
	run := 3 * e.h.Lease
	ids := e.publishMany(t, n, "brokertest.long")
	var (
		mu      sync.Mutex
		starts  = map[string]int{}
		running = map[string]int{}
	)
	handler := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		id := d.Message().ID
		mu.Lock()
		starts[id]++
		running[id]++
		if running[id] > 1 {
			t.Errorf("message %s run by two handlers at once (attempt %d): its lease was not extended", id, d.Attempt())
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			running[id]--
			mu.Unlock()
		}()
		select {
		case <-time.After(run):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	obs := newSettlements()
	for i := range 2 {
		opts := e.workerOptions(obs, uint64(10+i))
		opts.Concurrency = n
		opts.Prefetch = 1
		// Extensions every Lease/5 leave the heartbeat most of a lease of
		// slack on a loaded machine.
		opts.HeartbeatInterval = e.h.Lease / 5
		w, err := sdk.NewWorker(e.b, handler, opts)
		if err != nil {
			t.Fatalf("NewWorker: %v", err)
		}
		startWorker(t, w)
	}
	obs.waitFinals(t, n, e.h.Timeout+run)

	obs.mu.Lock()
	defer obs.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if starts[id] != 1 || obs.acked[id] != 1 {
			t.Errorf("message %s: started %d times, acked %d times; want once each", id, starts[id], obs.acked[id])
		}
	}
}
