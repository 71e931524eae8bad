package memory

import "github.com/berthq/berth/sdk"

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
func PublishWaiting(b *Broker, queue string) bool {
	q := b.existing(queue)
	if q == nil {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.room != nil
}
