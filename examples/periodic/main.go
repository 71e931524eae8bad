// Command periodic runs a periodic job the way a deployment would: three
// replicas of a service each run a scheduler for the same job
// ("metrics.rollup", every second), with no leader, and a Worker consumes
// the queue through the idempotency guard. Every replica publishes every
// slot; the guard applies each slot once and acks the copies. At the end it
// prints how many slots were published and applied.
//
//	go run ./examples/periodic -for 5s
//
// The same code runs on any broker: on PostgreSQL with DedupeEnqueue, on
// JetStream or on SQS FIFO the copies are dropped at publish already (see the
// periodic package doc).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/periodic"
	"github.com/berthq/berth/sdk"
)

const (
	queue    = "rollups"
	jobName  = "metrics.rollup"
	replicas = 3
)

func main() {
	d := flag.Duration("for", 5*time.Second, "how long to run")
	flag.Parse()
	a, err := start(periodic.RealClock{}, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		log.Fatal(err)
	}
	time.Sleep(*d)
	if err := a.stop(); err != nil {
		log.Fatal(err)
	}
	a.report(os.Stdout)
}

// app is the three schedulers, the broker and the Worker.
type app struct {
	broker *memory.Broker
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   chan error

	mu        sync.Mutex
	publishes map[time.Time]int // slot → publishes by all replicas
	applied   map[string]int    // slot → rollups applied
	settled   int               // deliveries settled (applied + copies acked)
}

func start(clock periodic.Clock, logger *slog.Logger) (*app, error) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		return nil, err
	}
	a := &app{broker: b, publishes: map[time.Time]int{}, applied: map[string]int{}, errs: make(chan error, replicas+1)}
	every, err := periodic.Every(time.Second, 0)
	if err != nil {
		return nil, err
	}
	job := periodic.Job{Name: jobName, Schedule: every, Queue: queue,
		Message: func(slot time.Time) (*sdk.Message, error) {
			return sdk.NewJSON(jobName, map[string]string{"window_end": slot.Format(time.RFC3339)})
		}}
	var scheds []*periodic.Scheduler
	for range replicas {
		s, err := periodic.New(b, periodic.Options{Clock: clock, Missed: periodic.CatchUp, MaxCatchUp: 5, Logger: logger,
			OnPublish: func(_ string, slot time.Time) {
				a.mu.Lock()
				a.publishes[slot]++
				a.mu.Unlock()
			}}, job)
		if err != nil {
			return nil, err
		}
		scheds = append(scheds, s)
	}
	guard, err := idempotency.Middleware(idempotency.Options{Store: memstore.New(memstore.Options{}), Logger: logger})
	if err != nil {
		return nil, err
	}
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(a.rollup), sdk.WorkerOptions{Queue: queue, Logger: logger,
		Middleware: []sdk.Middleware{guard}, Observers: []sdk.Observer{a}})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	for _, s := range scheds {
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.errs <- s.Run(ctx) }()
	}
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.errs <- w.Run(ctx) }()
	return a, nil
}

// rollup is the job: it would aggregate the window's metrics; here it
// counts how often each window was applied.
func (a *app) rollup(ctx context.Context, d sdk.Delivery) error {
	slot := d.Message().Header(periodic.HeaderSlot)
	a.mu.Lock()
	a.applied[slot]++
	a.mu.Unlock()
	return nil
}

// Start implements sdk.Observer.
func (a *app) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

// Settled implements sdk.Observer.
func (a *app) Settled(context.Context, sdk.Delivery, sdk.Settlement) {
	a.mu.Lock()
	a.settled++
	a.mu.Unlock()
}

// drained reports whether every published copy was settled.
func (a *app) drained() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.publishes {
		n += c
	}
	return a.settled == n
}

// stop waits (up to 10s) for the published copies to be settled, then stops
// the schedulers and the Worker.
func (a *app) stop() error {
	for deadline := time.Now().Add(10 * time.Second); !a.drained() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	a.cancel()
	a.wg.Wait()
	close(a.errs)
	var first error
	for err := range a.errs {
		if err != nil && first == nil {
			first = err
		}
	}
	return errors.Join(first, a.broker.Close())
}

// report prints the slots and how often each was published and applied.
func (a *app) report(out io.Writer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	slots := make([]time.Time, 0, len(a.publishes))
	for s := range a.publishes {
		slots = append(slots, s)
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].Before(slots[j]) })
	total := 0
	for _, s := range slots {
		n := a.publishes[s]
		total += n
		fmt.Fprintf(out, "slot %s: published %d×, applied %d×\n", s.Format(time.TimeOnly), n, a.applied[s.Format(time.RFC3339Nano)])
	}
	fmt.Fprintf(out, "%d slots, %d publishes by %d replicas, %d rollups applied\n", len(slots), total, replicas, len(a.applied))
}
