package pause_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/pause"
	"github.com/berthq/berth/sdk"
)

// down fails until up is set, then lists paused.
type down struct {
	up     atomic.Bool
	paused []pause.Paused
	calls  chan struct{}
}

func (d *down) Paused(context.Context) ([]pause.Paused, error) {
	select {
	case d.calls <- struct{}{}:
	default:
	}
	if !d.up.Load() {
		return nil, errors.New("database down")
	}
	return d.paused, nil
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// syncing is a Worker on queues reports and emails (one message each) with
// Sync reading l, which is down until l.up is set and then pauses emails.
type syncing struct {
	w    *sdk.Worker
	l    *down
	logs *syncBuf
	mu   sync.Mutex
	runs map[string]int // handled messages by queue
}

func (s *syncing) handled(q string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[q]
}

// startSyncing starts Sync, waits for its first (failed) read, then starts
// the Worker; both stop when the test ends.
func startSyncing(t *testing.T, opts pause.SyncOptions) *syncing {
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	s := &syncing{logs: &syncBuf{}, runs: map[string]int{}}
	h := sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		s.mu.Lock()
		s.runs[d.Queue()]++
		s.mu.Unlock()
		return nil
	})
	log := slog.New(slog.NewTextHandler(s.logs, nil))
	s.w, err = sdk.NewWorker(b, h, sdk.WorkerOptions{Logger: log, Queues: []sdk.WorkerQueue{{Name: "reports"}, {Name: "emails"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"reports", "emails"} {
		if err := b.Publish(ctx, q, &sdk.Message{Type: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	s.l = &down{paused: []pause.Paused{{Queue: "emails"}}, calls: make(chan struct{}, 1)}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	opts.Interval, opts.Logger = 20*time.Millisecond, log
	wg.Go(func() { _ = pause.Sync(rctx, s.w, s.l, opts) })
	<-s.l.calls // the first read ran (and failed) before the Worker starts
	wg.Go(func() { _ = s.w.Run(rctx) })
	return s
}

// waitHandled waits until queue q's message was handled.
func (s *syncing) waitHandled(t *testing.T, q string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.handled(q) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%s not run", q)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSyncHoldsQueuesUntilFirstRead: a Worker whose Sync could not read the
// table yet (the database is down as it starts) must not run a queue the
// table pauses: it holds every queue until the first read, says so in a
// warning, and then applies the table.
func TestSyncHoldsQueuesUntilFirstRead(t *testing.T) {
	s := startSyncing(t, pause.SyncOptions{})
	time.Sleep(300 * time.Millisecond) // several failed syncs
	if n := s.handled("reports") + s.handled("emails"); n != 0 {
		t.Errorf("handled %d before the pause table could be read once (emails is paused there)", n)
	}
	if l := s.logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "emails") {
		t.Errorf("no warning naming the queues held while the table cannot be read; log:\n%.300s", l)
	}
	s.l.up.Store(true)
	s.waitHandled(t, "reports")
	time.Sleep(100 * time.Millisecond)
	if !s.w.Paused("emails") || s.w.Paused("reports") {
		t.Errorf("after the first read: emails paused %v, reports paused %v; want true, false", s.w.Paused("emails"), s.w.Paused("reports"))
	}
	if n := s.handled("emails"); n != 0 {
		t.Errorf("%d emails handled while paused in the table", n)
	}
}

// TestSyncFailOpen: with FailOpen the Worker runs every queue while the
// table cannot be read, and the first read pauses what the table pauses.
func TestSyncFailOpen(t *testing.T) {
	s := startSyncing(t, pause.SyncOptions{FailOpen: true})
	s.waitHandled(t, "reports")
	s.waitHandled(t, "emails")
	if s.w.Paused("emails") {
		t.Error("emails paused before the table was read")
	}
	s.l.up.Store(true)
	deadline := time.Now().Add(10 * time.Second)
	for !s.w.Paused("emails") {
		if time.Now().After(deadline) {
			t.Fatal("emails not paused after the table was read")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s.w.Paused("reports") {
		t.Error("reports paused, the table does not pause it")
	}
}

// newHeldWorker is a Worker on queues reports and emails, with emails
// paused by the caller before any Sync.
func newHeldWorker(t *testing.T) *sdk.Worker {
	t.Helper()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queues: []sdk.WorkerQueue{{Name: "reports"}, {Name: "emails"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Pause("emails"); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestSyncCancelledBeforeStart: a Sync whose ctx is done already returns
// ctx's error at once, reads nothing, and leaves the Worker's queues as
// they were. Before, it paused every queue, returned nil, and left them
// paused: a Worker that ran nothing, silently.
func TestSyncCancelledBeforeStart(t *testing.T) {
	w := newHeldWorker(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l := &ctxLister{calls: make(chan struct{}, 1)}
	err := pause.Sync(ctx, w, l, pause.SyncOptions{Logger: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Sync with a cancelled ctx = %v, want context.Canceled", err)
	}
	if w.Paused("reports") || !w.Paused("emails") {
		t.Errorf("after Sync: reports paused %v, emails paused %v; want false, true (as before Sync)", w.Paused("reports"), w.Paused("emails"))
	}
	select {
	case <-l.calls:
		t.Error("Sync read the table under a cancelled ctx")
	default:
	}
}

// TestSyncEndedBeforeFirstRead: a Sync whose ctx ends while the table
// cannot be read hands back its hold (the queues the caller paused stay
// paused) and returns nil, as any Sync whose ctx ends. Before, every
// queue stayed held.
func TestSyncEndedBeforeFirstRead(t *testing.T) {
	w := newHeldWorker(t)
	l := &down{calls: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- pause.Sync(ctx, w, l, pause.SyncOptions{Interval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	}()
	<-l.calls // a read failed, with every queue held
	if !w.Paused("reports") {
		t.Error("reports not held while the table cannot be read")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Sync ended before any read = %v, want nil", err)
	}
	if w.Paused("reports") || !w.Paused("emails") {
		t.Errorf("after Sync: reports paused %v, emails paused %v; want false, true (as before Sync)", w.Paused("reports"), w.Paused("emails"))
	}
}

// ctxLister lists no paused queue, and fails as a database client does
// once its ctx is done.
type ctxLister struct{ calls chan struct{} }

func (c *ctxLister) Paused(ctx context.Context) ([]pause.Paused, error) {
	select {
	case c.calls <- struct{}{}:
	default:
	}
	return nil, ctx.Err()
}
