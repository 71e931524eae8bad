package periodic_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/periodic"
	"github.com/berthq/berth/sdk"
)

// hangQueue is a Publisher whose one queue never confirms (a RabbitMQ
// quorum queue without a leader, a JetStream stream without quorum) while
// the other queues publish. A publish to it blocks on the test's fake
// clock: for hang of fake time, then fails as a Publish cut by
// PublishTimeout does, or until its ctx ends (Run stops).
type hangQueue struct {
	recorder
	clock *periodic.FakeClock
	queue string
	hang  time.Duration
	mu    sync.Mutex
	hung  []string // the slots of publishes to queue begun, at the time begun
	late  []string // slots of the other queues published after their time
}

func (h *hangQueue) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	if queue != h.queue {
		now := h.clock.Now()
		for _, m := range msgs {
			if slot := m.Header(periodic.HeaderSlot); slot != now.Format(time.RFC3339Nano) {
				h.mu.Lock()
				h.late = append(h.late, slot+" at "+now.Format(time.TimeOnly))
				h.mu.Unlock()
			}
		}
		return h.recorder.Publish(ctx, queue, msgs...)
	}
	h.mu.Lock()
	for _, m := range msgs {
		h.hung = append(h.hung, m.Header(periodic.HeaderSlot)[11:19]+" at "+h.clock.Now().Format(time.TimeOnly))
	}
	h.mu.Unlock()
	if err := h.clock.Sleep(ctx, h.hang); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// A job whose publish hangs holds up only its own slots. One Run published
// one slot at a time: the healthy job's slots waited behind the hung
// publish, and under Skip those that came due meanwhile were dropped
// ("dropping missed slots schedule=healthy dropped=3"), or, with a publish
// that hangs until Run stops, never published.
func TestHungPublishDoesNotHoldUpOtherJobs(t *testing.T) {
	for _, tc := range []struct {
		name string
		hang time.Duration
		// The stuck job's publishes: one in flight at a time, retried a
		// second after it fails (Retry), its slots due meanwhile kept
		// under Skip (the latest).
		stuck []string
	}{
		{"until PublishTimeout", 30 * time.Second, []string{
			"00:01:00 at 00:01:00", // fails at 00:01:30, retried at the next wake
			"00:01:00 at 00:01:40", // fails at 00:02:10, 00:02:00 now due: 00:01:00 dropped
			"00:02:00 at 00:02:20", // fails at 00:02:50, retried with 00:03:00 due
			"00:03:00 at 00:03:00",
		}},
		{"until Run ends", 1000 * time.Hour, []string{"00:01:00 at 00:01:00"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := periodic.NewFakeClock(t0)
			p := &hangQueue{clock: c, queue: "stuck", hang: tc.hang}
			var logs strings.Builder
			var logMu sync.Mutex
			logger := slog.New(slog.NewTextHandler(&lockedWriter{mu: &logMu, w: &logs}, nil))
			// The stuck job comes first: the old Run published it first.
			s, err := periodic.New(p, periodic.Options{Clock: c, Logger: logger,
				PublishTimeout: time.Hour, // the hang is in fake time; this never cuts it
				Retry:          sdk.Backoff{Base: time.Second, Max: time.Second, Jitter: -1}},
				periodic.Job{Name: "stuck", Schedule: every(t, time.Minute), Queue: "stuck"},
				periodic.Job{Name: "healthy", Schedule: every(t, 10*time.Second), Queue: "good"})
			if err != nil {
				t.Fatal(err)
			}
			var steps []time.Duration
			var want []string
			for i := 1; i <= 18; i++ { // three minutes, slot by slot
				steps = append(steps, 10*time.Second)
				want = append(want, t0.Add(time.Duration(i)*10*time.Second).Format(time.TimeOnly))
			}
			drive(t, s, c, steps...)
			logMu.Lock()
			out := logs.String()
			logMu.Unlock()
			p.mu.Lock()
			late, hung := p.late, p.hung
			p.mu.Unlock()
			if len(late) > 0 {
				t.Errorf("healthy slots published late: %v", late)
			}
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "dropping missed slots") && strings.Contains(l, "schedule=healthy") {
					t.Errorf("the healthy job's slots were dropped: %s", l)
				}
			}
			equal(t, "healthy slots", p.slots(t), want)
			equal(t, "stuck publishes", hung, tc.stuck)
		})
	}
}

// gate is a Publisher that blocks each publish until the test releases it
// (not on the clock: work the test does not control).
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func (g *gate) Publish(ctx context.Context, _ string, _ ...*sdk.Message) error {
	g.entered <- struct{}{}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Publishes run beside Run's loop, which sleeps meanwhile: WaitSleepers
// must still wait for a publish in flight, and for Run to take its result
// (OnPublish), or each Advance would race the publishes.
func TestWaitSleepersWaitsForPublishInFlight(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	g := &gate{entered: make(chan struct{}, 1), release: make(chan struct{})}
	var published atomic.Int64
	s, err := periodic.New(g, periodic.Options{Clock: c, PublishTimeout: time.Hour,
		OnPublish: func(string, time.Time) { published.Add(1) }},
		periodic.Job{Name: "j", Schedule: every(t, 10*time.Second), Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	defer runScheduler(t, s)()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := c.WaitSleepers(wctx, 1); err != nil {
		t.Fatal(err)
	}
	c.Advance(10 * time.Second)
	select {
	case <-g.entered:
	case <-wctx.Done():
		t.Fatal("the due slot's publish did not start")
	}
	short, scancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer scancel()
	if err := c.WaitSleepers(short, 1); err == nil {
		t.Fatal("WaitSleepers returned while a publish was in flight")
	}
	close(g.release)
	if err := c.WaitSleepers(wctx, 1); err != nil {
		t.Fatal(err)
	}
	if n := published.Load(); n != 1 {
		t.Errorf("WaitSleepers returned with %d slots taken by Run (OnPublish), want 1", n)
	}
}

// panicky is a Publisher whose Publish panics, on one queue, beside a job
// on another queue whose publish waits on the clock until Run stops.
type panicky struct{ clock *periodic.FakeClock }

func (p panicky) Publish(ctx context.Context, queue string, _ ...*sdk.Message) error {
	if queue == "boom" {
		panic("publisher panicked")
	}
	return p.clock.Sleep(ctx, 1000*time.Hour)
}

// A Publish that panics raises its panic on Run's goroutine, as it did when
// Run called Publish itself, so Run's caller can recover it: a panic on the
// publish's own goroutine would end the process. Run does not wait for the
// other job's publish, in flight, to end by itself.
func TestPublishPanicReachesRunsCaller(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	s, err := periodic.New(panicky{clock: c}, periodic.Options{Clock: c, Logger: slog.New(slog.DiscardHandler)},
		periodic.Job{Name: "slow", Schedule: every(t, 5*time.Second), Queue: "slow"},
		periodic.Job{Name: "boom", Schedule: every(t, 10*time.Second), Queue: "boom"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan any, 1)
	go func() {
		defer func() { got <- recover() }()
		_ = s.Run(context.Background())
		t.Error("Run returned without panicking")
	}()
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitSleepers(wctx, 1); err != nil {
		t.Fatal(err)
	}
	c.Advance(10 * time.Second)
	select {
	case v := <-got:
		if v != "publisher panicked" {
			t.Fatalf("Run's caller recovered %v, want the publisher's panic", v)
		}
	case <-wctx.Done():
		t.Fatal("Run did not panic within 30s")
	}
}
