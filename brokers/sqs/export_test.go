package sqs

import (
	"context"
	"time"

	"github.com/berthq/berth/sdk"
)

// SetScanLimits shortens b's dead-letter scan hold and its bound on held
// letters, so that tests can run scans longer than a hold, and past the
// bound, in seconds.
func SetScanLimits(b *Broker, hold time.Duration, maxHeld int) {
	b.scanHold, b.scanMax = hold, maxHeld
}

// QueuedShared is the number of entries waiting in b's coalescer for a
// sender, over every queue.
func QueuedShared(b *Broker) int {
	b.co.mu.Lock()
	defer b.co.mu.Unlock()
	n := 0
	for _, p := range b.co.pending {
		n += len(p)
	}
	return n
}

// WireSize is the size SQS counts of m as berth sends it: body and
// attributes.
func WireSize(m *sdk.Message) int {
	e, err := encode(m)
	if err != nil {
		panic(err)
	}
	return e.size
}

// CopyReserve is what Publish keeps of MaxWireSize for the copies berth
// sends of a message (its dead letter, a redrive).
const CopyReserve = copyReserve

// AckGeneration is the generation of the deletes b's acker takes now; each
// Flush (Close's included) starts a new one.
func AckGeneration(b *Broker) uint64 {
	b.acks.mu.Lock()
	defer b.acks.mu.Unlock()
	return b.acks.gen
}

// AcksHeld is the number of deletes b's acker holds: buffered, waiting for
// a sender or being sent.
func AcksHeld(b *Broker) int {
	b.acks.mu.Lock()
	defer b.acks.mu.Unlock()
	n := 0
	for _, g := range b.acks.live {
		n += g.n
	}
	return n
}

// OnRedriveEnd makes every RedriveDeadLetters call fn, at its end, with how
// many redriven IDs the call remembered then; nil stops it.
func OnRedriveEnd(fn func(remembered int)) {
	if fn == nil {
		redriveMemo.Store(nil)
		return
	}
	redriveMemo.Store(&fn)
}

// QueueShared queues m for queue in b's coalescer as a Publish with ctx
// that waits for a sender does, and returns a func that waits for its
// outcome as that Publish would. No goroutine takes a sender for it: the
// next Publish that finds one free sends it.
func QueueShared(ctx context.Context, b *Broker, queue string, m *sdk.Message) (func() error, error) {
	if err := sdk.PrepareAll(ctx, queue, []*sdk.Message{m}, b.opts.MaxMessageSize); err != nil {
		return nil, err
	}
	e, err := b.entry(m, false, "", "", b.opts.MaxWireSize-copyReserve)
	if err != nil {
		return nil, err
	}
	q, err := b.queue(ctx, queue)
	if err != nil {
		return nil, err
	}
	w := &waiter{ctx: ctx, done: make(chan struct{}), left: 1}
	b.co.mu.Lock()
	b.co.pending[q.url] = append(b.co.pending[q.url], &shared{e: e, w: w})
	b.co.mu.Unlock()
	return func() error {
		<-w.done
		return w.result()
	}, nil
}
