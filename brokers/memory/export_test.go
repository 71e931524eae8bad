package memory

import (
	"time"

	"github.com/berthq/berth/sdk"
)

// PlantDeadLetter stores m as a dead letter of queue as it is, headers
// included, the way a message that reached the dead-letter list by a path
// berth does not control would look.
func PlantDeadLetter(b *Broker, queue string, m *sdk.Message) {
	q := b.queue(queue)
	q.mu.Lock()
	defer q.mu.Unlock()
	c := m.Clone()
	q.dead = append(q.dead, c)
	q.numberDead(c) // a position, as every dead letter has, for the page walks
}

// PublishWaiting reports whether a Publish to queue waits for room in its
// backlog (Options.MaxBacklog).
func PublishWaiting(b *Broker, queue string) bool { return PublishesWaiting(b, queue) > 0 }

// PublishesWaiting returns how many Publish calls to queue wait for room in
// its backlog.
func PublishesWaiting(b *Broker, queue string) int {
	q := b.existing(queue)
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters)
}

// MakeRoom runs before and then leases one ready message of queue, as a
// Receive does (its delivery is dropped), without letting the queue's lock
// go in between.
func MakeRoom(b *Broker, queue string, before func()) {
	q := b.queue(queue)
	q.mu.Lock()
	defer q.mu.Unlock()
	before()
	now := time.Now()
	q.promote(now, b.maxDeliveries)
	b.take(q, 1, now)
}

// HeapCaps returns the capacities of queue's delayed and in-flight heaps.
func HeapCaps(b *Broker, queue string) (delayed, inFlight int) {
	q := b.queue(queue)
	q.mu.Lock()
	defer q.mu.Unlock()
	return cap(q.delayed), cap(q.inFlight)
}

// ReadyCap returns the capacity of queue's ready FIFO.
func ReadyCap(b *Broker, queue string) int {
	q := b.queue(queue)
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ready.buf)
}

// DeadLetterCursors returns how many entries queue's dead-letter cursor map
// (the position of each dead letter, which DeadLetterPage cursors name)
// holds.
func DeadLetterCursors(b *Broker, queue string) int {
	q := b.queue(queue)
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.deadSeq)
}
