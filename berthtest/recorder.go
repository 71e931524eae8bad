package berthtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// Record is one settlement a [Recorder] saw.
type Record struct {
	Message *sdk.Message // the delivered message
	Queue   string
	Attempt int
	sdk.Settlement
}

// Recorder is an [sdk.Observer] that records every settlement of the
// Workers it is given to, so a test can wait for them instead of sleeping.
// Its methods may be called concurrently.
type Recorder struct {
	mu      sync.Mutex
	records []Record
	changed chan struct{} // closed and replaced at every settlement
	timeout time.Duration // of the waits; 0: WaitTimeout
	// stopped is closed when the Worker of StartWorker returned from Run,
	// runErr (written before) what it returned; nil for NewRecorder's.
	stopped chan struct{}
	runErr  error
}

var _ sdk.Observer = (*Recorder)(nil)

// NewRecorder returns an empty Recorder. Add it to WorkerOptions.Observers.
func NewRecorder() *Recorder { return &Recorder{changed: make(chan struct{})} }

// Start returns ctx unchanged.
func (r *Recorder) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

// Settled records s.
func (r *Recorder) Settled(_ context.Context, d sdk.Delivery, s sdk.Settlement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, Record{Message: d.Message(), Queue: d.Queue(), Attempt: d.Attempt(), Settlement: s})
	close(r.changed)
	r.changed = make(chan struct{})
}

// SetWaitTimeout makes the recorder's waits ([Recorder.Wait],
// [Recorder.WaitDone], [Recorder.WaitFor]) wait up to d before failing the
// test, instead of [WaitTimeout]; 0 goes back to WaitTimeout. Unlike a
// change of WaitTimeout, it is safe in a test under t.Parallel.
func (r *Recorder) SetWaitTimeout(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timeout = d
}

// Records returns the settlements so far, in order.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Record(nil), r.records...)
}

// Wait waits up to [WaitTimeout] (or [Recorder.SetWaitTimeout]) until n
// settlements were recorded and returns them all; it fails the test if they
// do not come.
func (r *Recorder) Wait(t testing.TB, n int) []Record {
	t.Helper()
	return r.WaitFor(t, fmt.Sprintf("%d settlements", n), func(rs []Record) bool { return len(rs) >= n })
}

// WaitDone waits until n messages were finished (acked or dead-lettered,
// whatever retries came before) and returns their final settlements, one
// per message, in the order they finished. Messages are told apart by ID: a
// message finished twice (delivered again after its ack, as at-least-once
// brokers may) counts once, and its first finishing settlement is returned;
// see [Recorder.Records] for all of them. An ack or a dead letter the
// broker refused (Settlement.Err: the lease had run out, the broker was
// closed) finished nothing: the job comes back, and WaitDone waits for the
// settlement that does finish it. A message the broker finished itself is
// not seen: one dead-lettered by the broker's delivery cap when the lease of
// its last delivery ran out (the late ack is refused, and no delivery
// follows) makes WaitDone time out; wait for such a message with
// [Recorder.WaitFor] or the broker's statistics. It waits as long as
// [Recorder.WaitFor].
//
// The settlement of an earlier attempt may be recorded after the final one:
// the Worker tells observers once the broker has taken a retry, and by then
// the broker may have delivered the next attempt to another handler. A test
// that counts every settlement waits for that count with [Recorder.Wait] or
// [Recorder.WaitFor].
func (r *Recorder) WaitDone(t testing.TB, n int) []Record {
	t.Helper()
	all := r.WaitFor(t, fmt.Sprintf("%d finished messages", n), func(rs []Record) bool { return len(finished(rs)) >= n })
	return finished(all)
}

// finished returns the settlements that finished a message, the first of
// each message ID (a message without an ID counts at each one).
func finished(rs []Record) []Record {
	var out []Record
	seen := map[string]bool{}
	for _, r := range rs {
		if (r.Action == sdk.ActionAck || r.Action == sdk.ActionDeadLetter) && r.Err == nil {
			if id := r.Message.ID; id != "" {
				if seen[id] {
					continue
				}
				seen[id] = true
			}
			out = append(out, r)
		}
	}
	return out
}

// WaitFor waits up to [WaitTimeout] (or [Recorder.SetWaitTimeout]) until
// cond holds on the settlements so far and returns them; it fails the test,
// naming what, if cond never holds. On the Recorder of [StartWorker], it
// fails at once, with Run's error, when the Worker has stopped (a closed
// broker, a missing queue): no settlement can come any more. The same goes
// for [Recorder.Wait] and [Recorder.WaitDone].
func (r *Recorder) WaitFor(t testing.TB, what string, cond func([]Record) bool) []Record {
	t.Helper()
	r.mu.Lock()
	timeout := waitTimeout(r.timeout)
	r.mu.Unlock()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	stopped := false
	for {
		r.mu.Lock()
		all := append([]Record(nil), r.records...)
		changed := r.changed
		r.mu.Unlock()
		if cond(all) {
			return all
		}
		if stopped {
			t.Fatalf("berthtest: the Worker stopped (Run returned %v) while waiting for %s; %d settlements: %s", r.runErr, what, len(all), summary(all))
			return nil
		}
		select {
		case <-changed:
		case <-r.stopped: // nil (never ready) but for StartWorker's
			stopped = true // look once more: its last settlements came before
		case <-timer.C:
			t.Fatalf("berthtest: timed out after %s waiting for %s; %d settlements: %s", timeout, what, len(all), summary(all))
			return nil
		}
	}
}

func summary(rs []Record) string {
	const show = 10
	s := ""
	for i, r := range rs {
		if i == show {
			return s + fmt.Sprintf(" … (%d more)", len(rs)-show)
		}
		s += fmt.Sprintf(" [%q %q attempt %d: %s", r.Message.ID, r.Message.Type, r.Attempt, r.Action)
		if r.Cause != nil {
			s += fmt.Sprintf(" (%s)", sdk.SanitizeReason(r.Cause.Error()))
		}
		if r.Err != nil { // refused: WaitDone does not count it
			s += fmt.Sprintf(", refused: %s", sdk.SanitizeReason(r.Err.Error()))
		}
		s += "]"
	}
	return s
}

// Memory returns an in-memory broker closed when the test ends.
func Memory(t testing.TB, opts ...memory.Options) *memory.Broker {
	t.Helper()
	var o memory.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	b, err := memory.New(o)
	if err != nil {
		t.Fatalf("berthtest: memory broker: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// StartWorker runs a Worker for h on opts.Queue of sub until the test ends
// (it then stops the Worker and waits for it, failing the test if Run
// returned an error), and returns a Recorder of its settlements, added to
// opts.Observers. The recorder's waits fail as soon as the Worker has
// stopped (Run returned an error during the test). Logger defaults to one
// that discards.
func StartWorker(t testing.TB, sub sdk.Subscriber, h sdk.Handler, opts sdk.WorkerOptions) *Recorder {
	t.Helper()
	rec := NewRecorder()
	rec.stopped = make(chan struct{})
	opts.Observers = append(append([]sdk.Observer(nil), opts.Observers...), rec)
	if opts.Logger == nil {
		opts.Logger = discard
	}
	w, err := sdk.NewWorker(sub, h, opts)
	if err != nil {
		t.Fatalf("berthtest: worker: %v", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() {
		err := w.Run(ctx)
		rec.runErr = err // read by the waits once stopped is closed
		close(rec.stopped)
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("berthtest: worker on %q: %v", opts.Queue, err)
		}
	})
	return rec
}
