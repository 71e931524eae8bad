package periodic_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/periodic"
	"github.com/berthq/berth/sdk"
)

// settled counts the Worker's settlements and signals each.
type settled struct {
	n  atomic.Int64
	ch chan sdk.Settlement
}

func (s *settled) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }
func (s *settled) Settled(_ context.Context, _ sdk.Delivery, st sdk.Settlement) {
	s.n.Add(1)
	s.ch <- st
}

// fleet runs n schedulers of the same job on one fake clock, publishing to
// a memory broker consumed by a Worker whose handler is guarded by the
// idempotency middleware, and counts publishes and effects per slot.
type fleet struct {
	clock     *periodic.FakeClock
	broker    *memory.Broker
	mu        sync.Mutex
	publishes map[time.Time]int // slot → publishes, over all schedulers
	effects   map[string]int    // slot header → effects
	obs       *settled
}

func newFleet(t *testing.T, start time.Time) *fleet {
	t.Helper()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return &fleet{
		clock: periodic.NewFakeClock(start), broker: b,
		publishes: map[time.Time]int{}, effects: map[string]int{},
		obs: &settled{ch: make(chan sdk.Settlement, 10_000)},
	}
}

func (f *fleet) onPublish(_ string, slot time.Time) {
	f.mu.Lock()
	f.publishes[slot]++
	f.mu.Unlock()
}

// worker starts the consumer; the returned func stops it and waits.
func (f *fleet) worker(t *testing.T, queue string) func() {
	t.Helper()
	guard, err := idempotency.Middleware(idempotency.Options{Store: memstore.New(memstore.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		f.mu.Lock()
		f.effects[d.Message().Header(periodic.HeaderSlot)]++
		f.mu.Unlock()
		return nil
	})
	w, err := sdk.NewWorker(f.broker, h, sdk.WorkerOptions{Queue: queue, Concurrency: 4,
		Middleware: []sdk.Middleware{guard}, Observers: []sdk.Observer{f.obs}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	}
}

// waitSettled waits for n settlements in total, failing on any that is not
// an ack.
func (f *fleet) waitSettled(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for got := 0; got < n; got++ {
		select {
		case s := <-f.obs.ch:
			if s.Action != sdk.ActionAck {
				t.Fatalf("settlement %d: %s (%v), want ack", got, s.Action, s.Cause)
			}
		case <-timeout:
			t.Fatalf("%d of %d settlements after 30s", got, n)
		}
	}
}

// runSchedulers starts the schedulers, then advances the clock by random
// steps of at most maxStep until total has passed, letting every scheduler
// finish its publishes and sleep again before each step.
func (f *fleet) runSchedulers(t *testing.T, scheds []*periodic.Scheduler, total, maxStep time.Duration, seed uint64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, s := range scheds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Run(ctx); err != nil {
				t.Errorf("scheduler: %v", err)
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	rnd := rand.New(rand.NewPCG(seed, seed))
	for elapsed := time.Duration(0); elapsed < total; {
		if err := f.clock.WaitSleepers(wctx, len(scheds)); err != nil {
			t.Fatalf("schedulers did not go back to sleep: %v", err)
		}
		step := min(time.Duration(1+rnd.IntN(int(maxStep/time.Second)))*time.Second, total-elapsed)
		f.clock.Advance(step)
		elapsed += step
	}
	if err := f.clock.WaitSleepers(wctx, len(scheds)); err != nil {
		t.Fatalf("schedulers did not go back to sleep: %v", err)
	}
}

// slotsBetween lists the slots of s in (from, to].
func slotsBetween(s periodic.Schedule, from, to time.Time) []time.Time {
	var out []time.Time
	for n := s.Next(from); !n.After(to); n = s.Next(n) {
		out = append(out, n)
	}
	return out
}

// TestThreeSchedulersOneSlotOnce is the acceptance test: three schedulers of
// one cron schedule over five minutes of simulated time publish every slot
// (each publishes it: the memory broker has no publish dedupe) and the
// guarded handler applies each slot exactly once. No real sleeping.
func TestThreeSchedulersOneSlotOnce(t *testing.T) {
	start := time.Date(2026, 11, 30, 23, 59, 3, 0, time.UTC)
	f := newFleet(t, start)
	sched := periodic.MustCron("*/15 * * * * *")
	job := periodic.Job{Name: "report.refresh", Schedule: sched, Queue: "periodic"}
	var scheds []*periodic.Scheduler
	for range 3 {
		s, err := periodic.New(f.broker, periodic.Options{Clock: f.clock, Missed: periodic.CatchUp, OnPublish: f.onPublish}, job)
		if err != nil {
			t.Fatal(err)
		}
		scheds = append(scheds, s)
	}
	stop := f.worker(t, "periodic")
	defer stop()

	const total = 5 * time.Minute
	f.runSchedulers(t, scheds, total, 20*time.Second, 7)
	want := slotsBetween(sched, start, start.Add(total))
	if len(want) != 20 {
		t.Fatalf("%d slots in 5 minutes of */15s, want 20", len(want))
	}
	f.waitSettled(t, 3*len(want))

	f.mu.Lock()
	defer f.mu.Unlock()
	for _, slot := range want {
		if got := f.publishes[slot]; got != 3 {
			t.Errorf("slot %s published %d times, want 3 (once per scheduler)", slot, got)
		}
		if got := f.effects[slot.Format(time.RFC3339Nano)]; got != 1 {
			t.Errorf("slot %s applied %d times, want exactly 1", slot, got)
		}
	}
	if len(f.publishes) != len(want) || len(f.effects) != len(want) {
		t.Errorf("%d slots published, %d applied; want %d each", len(f.publishes), len(f.effects), len(want))
	}
}

// A scheduler that starts late with CatchUp and a Lookback republishes the
// slots it missed (bounded by MaxCatchUp); the guard absorbs the ones the
// others had published, so every slot is still applied once.
func TestLateSchedulerCatchesUpOnceInEffect(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	f := newFleet(t, start)
	every, err := periodic.Every(10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	job := periodic.Job{Name: "sweep", Schedule: every, Queue: "sweep"}
	early, err := periodic.New(f.broker, periodic.Options{Clock: f.clock, OnPublish: f.onPublish}, job)
	if err != nil {
		t.Fatal(err)
	}
	stop := f.worker(t, "sweep")
	defer stop()
	f.runSchedulers(t, []*periodic.Scheduler{early}, time.Minute, 3*time.Second, 1)

	late, err := periodic.New(f.broker, periodic.Options{Clock: f.clock, OnPublish: f.onPublish,
		Missed: periodic.CatchUp, Lookback: time.Hour, MaxCatchUp: 4}, job)
	if err != nil {
		t.Fatal(err)
	}
	f.runSchedulers(t, []*periodic.Scheduler{early, late}, time.Minute, 3*time.Second, 2)

	// early: 6 slots; late: 4 caught up (0:00:30..0:01:00) + 6 new; early again: 6 new.
	f.waitSettled(t, 6+4+6+6)
	f.mu.Lock()
	defer f.mu.Unlock()
	want := slotsBetween(every, start, start.Add(2*time.Minute))
	for _, slot := range want {
		if got := f.effects[slot.Format(time.RFC3339Nano)]; got != 1 {
			t.Errorf("slot %s applied %d times, want 1", slot, got)
		}
	}
	for _, s := range []time.Duration{30, 40, 50, 60} {
		slot := start.Add(s * time.Second)
		if got := f.publishes[slot]; got != 2 {
			t.Errorf("slot %s published %d times, want 2 (early, then the late one's catch-up)", slot, got)
		}
	}
	if got := f.publishes[start.Add(20*time.Second)]; got != 1 {
		t.Errorf("slot 0:00:20 published %d times, want 1: older than MaxCatchUp", got)
	}
}
