package ledger_test

import (
	"context"
	"errors"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// finals records each message's final settlement as the Worker saw it.
type finals struct {
	mu       sync.Mutex
	actions  map[string]sdk.Action
	attempts map[string]int
	n        atomic.Int64
}

func (f *finals) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (f *finals) Settled(_ context.Context, d sdk.Delivery, s sdk.Settlement) {
	if s.Action != sdk.ActionAck && s.Action != sdk.ActionDeadLetter {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	id := d.Message().ID
	if _, dup := f.actions[id]; !dup {
		f.n.Add(1)
	}
	f.actions[id], f.attempts[id] = s.Action, d.Attempt()
}

// flaky fails a message transiently on some attempts and permanently for
// some messages, decided by a hash of its body and attempt (reproducible).
func flaky(ctx context.Context, d sdk.Delivery) error {
	h := fnv.New32a()
	h.Write(d.Message().Body)
	h.Write([]byte{byte(d.Attempt())})
	switch v := h.Sum32() % 100; {
	case v < 5:
		return sdk.Permanent(errors.New("bad input"))
	case v < 35:
		return errors.New("upstream timeout")
	}
	return nil
}

// soak publishes n jobs to a memory broker through l's Publisher, runs them
// with random failures, and returns what the Worker settled.
func soak(t *testing.T, l *ledger.Ledger, q string, n int) *finals {
	t.Helper()
	ctx := testCtx(t, 120*time.Second)
	b, err := memory.New(memory.Options{Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pub := l.Publisher(b)
	for i := 0; i < n; i += 500 {
		msgs := make([]*sdk.Message, 0, 500)
		for j := i; j < min(i+500, n); j++ {
			msgs = append(msgs, &sdk.Message{Type: "soak", Body: []byte(strconv.Itoa(j))})
		}
		if err := pub.Publish(ctx, q, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	f := &finals{actions: map[string]sdk.Action{}, attempts: map[string]int{}}
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(flaky), sdk.WorkerOptions{
		Queue: q, Concurrency: 16, Logger: quiet, Observers: []sdk.Observer{l, f},
		Retry: sdk.RetryPolicy{MaxAttempts: 3, Backoff: sdk.Backoff{Base: time.Millisecond, Max: 5 * time.Millisecond}},
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	for f.n.Load() < int64(n) {
		select {
		case <-ctx.Done():
			cancel()
			<-done
			t.Fatalf("%d of %d jobs settled", f.n.Load(), n)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return f
}

// listAll pages through the ledger rows of q.
func listAll(t *testing.T, r ledger.Reader, q string) map[string]ledger.Job {
	t.Helper()
	ctx := testCtx(t, 60*time.Second)
	rows := map[string]ledger.Job{}
	f := ledger.Filter{Queue: q, Limit: 1000}
	for {
		p, err := r.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range p.Jobs {
			if _, dup := rows[j.MessageID]; dup {
				t.Fatalf("List returned %s twice", j.MessageID)
			}
			rows[j.MessageID] = j
		}
		if p.Next == "" {
			return rows
		}
		f.After = p.Next
	}
}

// TestTenThousandJobsMatchTheWorker: with a buffer the writer keeps up
// with, the ledger's final statuses and attempts equal the Worker's
// settlements one for one. Three writers write its batches concurrently,
// in whatever order they land.
func TestTenThousandJobsMatchTheWorker(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 2000
	}
	store := newStore(t, newPool(t))
	l := newLedger(t, store, ledger.Options{BlockTimeout: 30 * time.Second, Writers: 3})
	q := "soak_" + suffix()
	f := soak(t, l, q, n)
	if err := l.Flush(testCtx(t, 60*time.Second)); err != nil {
		t.Fatal(err)
	}
	s := l.Stats()
	if s.Dropped != 0 || s.Failed != 0 || s.Written != s.Recorded {
		t.Fatalf("stats %+v: nothing may be dropped or failed", s)
	}
	rows := listAll(t, store, q)
	if len(rows) != n {
		t.Errorf("%d ledger rows, want %d", len(rows), n)
	}
	want := map[sdk.Action]ledger.Status{sdk.ActionAck: ledger.StatusSucceeded, sdk.ActionDeadLetter: ledger.StatusDead}
	wrong := 0
	for id, a := range f.actions {
		j, ok := rows[id]
		if !ok || j.Status != want[a] || j.Attempts != f.attempts[id] {
			if wrong++; wrong <= 5 {
				t.Errorf("job %s: ledger %s at attempt %d, worker %s at attempt %d", id, j.Status, j.Attempts, a, f.attempts[id])
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d jobs differ", wrong, n)
	}
	c, err := store.Counts(testCtx(t, 10*time.Second), ledger.Window{Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	var acked, dead int64
	for _, a := range f.actions {
		if a == sdk.ActionAck {
			acked++
		} else {
			dead++
		}
	}
	if c.ByStatus[ledger.StatusSucceeded] != acked || c.ByStatus[ledger.StatusDead] != dead {
		t.Errorf("counts %+v, worker: %d acked, %d dead", c, acked, dead)
	}
	t.Logf("%d jobs: %d succeeded, %d dead; ledger %+v", n, acked, dead, s)
}

// TestOverrunDropsAndCountsWithoutAffectingJobs: a buffer far too small
// for the rate, with no waiting, drops events and counts them, and every
// job is still processed; the rows the ledger did write never contradict
// the Worker.
func TestOverrunDropsAndCountsWithoutAffectingJobs(t *testing.T) {
	n := 5000
	if testing.Short() {
		n = 1000
	}
	store := newStore(t, newPool(t))
	l := newLedger(t, store, ledger.Options{Buffer: 4, BatchSize: 4, BlockTimeout: -1})
	q := "overrun_" + suffix()
	f := soak(t, l, q, n) // fails the test unless all n jobs settle
	if err := l.Flush(testCtx(t, 60*time.Second)); err != nil {
		t.Fatal(err)
	}
	s := l.Stats()
	if s.Dropped == 0 || s.Written+s.Dropped+s.Failed != s.Recorded {
		t.Fatalf("stats %+v: want drops, and every event written, dropped or failed", s)
	}
	if len(f.actions) != n {
		t.Errorf("the Worker settled %d of %d jobs", len(f.actions), n)
	}
	rows := listAll(t, store, q)
	for id, j := range rows {
		a, ok := f.actions[id]
		if ok && (j.Status == ledger.StatusSucceeded && a != sdk.ActionAck || j.Status == ledger.StatusDead && a != sdk.ActionDeadLetter) {
			t.Errorf("job %s: ledger %s, worker %s", id, j.Status, a)
		}
	}
	t.Logf("%d jobs; ledger %+v; %d rows", n, s, len(rows))
}
