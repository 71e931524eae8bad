package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthq/berth/sdk"
)

// tracker wraps the broker's Subscriber to see every settlement that
// reaches the broker, so the scenario knows when each published job is done
// (acked or dead-lettered). With crash on, it drops a tenth of first-attempt
// acks: to the broker that is exactly a worker killed after its commit and
// before its ack, and the message comes back after its lease.
type tracker struct {
	sub   sdk.Subscriber
	crash bool

	mu        sync.Mutex
	rng       *rand.Rand
	done      map[string]bool
	dead      []deadLetter
	total     int
	allDone   chan struct{}
	closeOnce sync.Once

	acked, deadCount, dropped atomic.Int64
}

func newTracker(sub sdk.Subscriber, crash bool, seed uint64, total int) *tracker {
	return &tracker{sub: sub, crash: crash, rng: rand.New(rand.NewPCG(seed, 7)), done: map[string]bool{}, total: total, allDone: make(chan struct{})}
}

func (t *tracker) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	ds, err := t.sub.Receive(ctx, queue, max)
	for i, d := range ds {
		td := &tracked{Delivery: d, t: t}
		if _, ok := d.(sdk.Releaser); ok {
			ds[i] = &trackedReleaser{td}
		} else {
			ds[i] = td
		}
	}
	return ds, err
}

func (t *tracker) settled() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.done)
}

func (t *tracker) finish(m *sdk.Message, cause error, dead bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if dead {
		reason := "dead-lettered"
		if cause != nil {
			reason = cause.Error()
		}
		t.dead = append(t.dead, deadLetter{MessageID: m.ID, Key: m.IdempotencyKey, Reason: reason, Cause: cause})
	}
	t.done[m.ID] = true
	if len(t.done) >= t.total {
		t.closeOnce.Do(func() { close(t.allDone) })
	}
}

func (t *tracker) deadLetters() []deadLetter {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]deadLetter(nil), t.dead...)
}

func (t *tracker) dropAck(attempt int) bool {
	if !t.crash || attempt > 1 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rng.IntN(10) == 0
}

type tracked struct {
	sdk.Delivery
	t *tracker
}

func (d *tracked) Ack(ctx context.Context) error {
	if d.t.dropAck(d.Attempt()) {
		d.t.dropped.Add(1)
		return nil // the process "died": its ack never reached the broker
	}
	err := d.Delivery.Ack(ctx)
	if err == nil {
		d.t.acked.Add(1)
		d.t.finish(d.Message(), nil, false)
	}
	return err
}

func (d *tracked) DeadLetter(ctx context.Context, cause error) error {
	err := d.Delivery.DeadLetter(ctx, cause)
	if err == nil {
		d.t.deadCount.Add(1)
		d.t.finish(d.Message(), cause, true)
	}
	return err
}

// trackedReleaser keeps the broker's Release visible to the Worker.
type trackedReleaser struct{ *tracked }

func (d *trackedReleaser) Release(ctx context.Context, delay time.Duration) error {
	return d.Delivery.(sdk.Releaser).Release(ctx, delay)
}
