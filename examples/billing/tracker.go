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

// subscriber is what the Workers receive through: t, with the optional
// interfaces of the broker's Subscriber that the Worker looks for. A wrapper
// that only had Receive hid them: the Worker then took no lease or delivery
// cap from the broker, did not flush SQS's buffered deletes at drain, cut
// SQS's long polls at shutdown, and Pause left RabbitMQ's prefetched
// messages held (ReceiveStopper). The methods on tracker forward to the
// broker, and answer as "not supported" where it lacks one (a zero lease,
// no cap, nothing to flush); LongPoller, whose presence alone changes the
// Worker, is added only when the broker has it.
func (t *tracker) subscriber() sdk.Subscriber {
	if lp, ok := t.sub.(sdk.LongPoller); ok {
		return struct {
			*tracker
			sdk.LongPoller
		}{t, lp}
	}
	return t
}

func (t *tracker) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	ds, err := t.sub.Receive(ctx, queue, max)
	for i, d := range ds {
		ds[i] = t.wrap(d)
	}
	return ds, err
}

// wrap returns d, tracked, with the optional interfaces of d the Worker
// uses: Releaser and AsyncAcker.
func (t *tracker) wrap(d sdk.Delivery) sdk.Delivery {
	td := &tracked{Delivery: d, t: t}
	_, rel := d.(sdk.Releaser)
	_, async := d.(sdk.AsyncAcker)
	switch {
	case rel && async:
		return trackedAsyncReleaser{td}
	case rel:
		return trackedReleaser{td}
	case async:
		return trackedAsync{td}
	}
	return td
}

// Lease forwards the broker's sdk.LeaseReporter (0: none).
func (t *tracker) Lease() time.Duration {
	if lr, ok := t.sub.(sdk.LeaseReporter); ok {
		return lr.Lease()
	}
	return 0
}

// MaxDeliveries forwards the broker's sdk.DeliveryCapReporter (0: no cap).
func (t *tracker) MaxDeliveries() int {
	if cr, ok := t.sub.(sdk.DeliveryCapReporter); ok {
		return cr.MaxDeliveries()
	}
	return 0
}

// ReceiveBatch forwards the broker's sdk.ReceiveBatcher (0: no limit).
func (t *tracker) ReceiveBatch() int {
	if rb, ok := t.sub.(sdk.ReceiveBatcher); ok {
		return rb.ReceiveBatch()
	}
	return 0
}

// Flush forwards the broker's sdk.Flusher.
func (t *tracker) Flush(ctx context.Context) error {
	if f, ok := t.sub.(sdk.Flusher); ok {
		return f.Flush(ctx)
	}
	return nil
}

// StopReceiving forwards the broker's sdk.ReceiveStopper.
func (t *tracker) StopReceiving(ctx context.Context, queue string) error {
	if rs, ok := t.sub.(sdk.ReceiveStopper); ok {
		return rs.StopReceiving(ctx, queue)
	}
	return nil
}

// ConnectionError forwards the broker's sdk.ConnectionReporter (nil: up).
func (t *tracker) ConnectionError() error {
	if cr, ok := t.sub.(sdk.ConnectionReporter); ok {
		return cr.ConnectionError()
	}
	return nil
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

// ackAsync is AckAsync for a delivery whose broker's has it: it sees the
// ack's outcome like Ack does.
func (d *tracked) ackAsync(ctx context.Context, done func(error)) {
	if d.t.dropAck(d.Attempt()) {
		d.t.dropped.Add(1)
		done(nil) // the process "died": its ack never reached the broker
		return
	}
	d.Delivery.(sdk.AsyncAcker).AckAsync(ctx, func(err error) {
		if err == nil {
			d.t.acked.Add(1)
			d.t.finish(d.Message(), nil, false)
		}
		done(err)
	})
}

func (d *tracked) release(ctx context.Context, delay time.Duration) error {
	return d.Delivery.(sdk.Releaser).Release(ctx, delay)
}

// trackedReleaser keeps the broker's Release visible to the Worker.
type trackedReleaser struct{ *tracked }

func (d trackedReleaser) Release(ctx context.Context, delay time.Duration) error {
	return d.release(ctx, delay)
}

// trackedAsync keeps the broker's AckAsync visible to the Worker.
type trackedAsync struct{ *tracked }

func (d trackedAsync) AckAsync(ctx context.Context, done func(error)) { d.ackAsync(ctx, done) }

// trackedAsyncReleaser keeps both.
type trackedAsyncReleaser struct{ *tracked }

func (d trackedAsyncReleaser) Release(ctx context.Context, delay time.Duration) error {
	return d.release(ctx, delay)
}

func (d trackedAsyncReleaser) AckAsync(ctx context.Context, done func(error)) { d.ackAsync(ctx, done) }
