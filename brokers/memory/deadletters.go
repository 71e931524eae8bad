package memory

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/berthq/berth/sdk"
)

func itoa(n int) string { return strconv.Itoa(n) }

// deadQueue returns the existing queue for a dead-letter call.
func (b *Broker) deadQueue(queue string) (*queue, error) {
	if b.closed.Load() {
		return nil, sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	return b.existing(queue), nil
}

// ListDeadLetters returns copies of up to limit ([sdk.DefaultListLimit]
// when limit <= 0, as on every broker) of queue's dead letters, oldest
// first. [Broker.DeadLetterPage] walks them all.
func (b *Broker) ListDeadLetters(_ context.Context, queue string, limit int) ([]*sdk.Message, error) {
	q, err := b.deadQueue(queue)
	if err != nil || q == nil {
		return nil, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.promote(time.Now(), b.maxDeliveries)
	if limit <= 0 {
		limit = sdk.DefaultListLimit
	}
	n := min(len(q.dead), limit)
	out := make([]*sdk.Message, n)
	for i := range out {
		out[i] = q.dead[i].Clone()
	}
	return out, nil
}

// GetDeadLetter returns a copy of the dead letter of queue with id, or an
// error wrapping [sdk.ErrNotFound].
func (b *Broker) GetDeadLetter(_ context.Context, queue, id string) (*sdk.Message, error) {
	q, err := b.deadQueue(queue)
	if err != nil {
		return nil, err
	}
	if q != nil {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.promote(time.Now(), b.maxDeliveries)
		for _, m := range q.dead {
			if m.ID == id {
				return m.Clone(), nil
			}
		}
	}
	return nil, notFound(queue, id)
}

func notFound(queue, id string) error {
	return &notFoundError{queue: queue, id: id}
}

// notFoundError wraps sdk.ErrNotFound with the queue and id.
type notFoundError struct{ queue, id string }

func (e *notFoundError) Error() string {
	return "memory: no dead letter " + e.id + " in queue " + e.queue
}

func (e *notFoundError) Unwrap() error { return sdk.ErrNotFound }

// RedriveDeadLetters puts the dead letters with the given ids (all of them
// when none is given) back on queue, the queue they were dead-lettered from
// (not a queue a header names), ready
// now, with attempts reset and [sdk.HeaderRedriveCount] incremented. It
// returns how many it redrove; an unknown id is an error wrapping
// [sdk.ErrNotFound], and then nothing is redriven.
func (b *Broker) RedriveDeadLetters(_ context.Context, queue string, ids ...string) (int, error) {
	q, err := b.deadQueue(queue)
	if err != nil {
		return 0, err
	}
	if q == nil {
		if len(ids) > 0 {
			return 0, notFound(queue, ids[0])
		}
		return 0, nil
	}
	q.mu.Lock()
	q.promote(time.Now(), b.maxDeliveries) // a poison message whose last lease ran out is a dead letter
	var picked []*sdk.Message
	if len(ids) == 0 {
		picked, q.dead, q.deadSeq = q.dead, nil, nil
	} else {
		want := make(map[string]bool, len(ids))
		for _, id := range ids {
			want[id] = true
		}
		found := make(map[string]bool, len(ids))
		for _, m := range q.dead {
			if want[m.ID] {
				found[m.ID] = true
			}
		}
		for _, id := range ids {
			if !found[id] {
				q.mu.Unlock()
				return 0, notFound(queue, id)
			}
		}
		q.dead = slices.DeleteFunc(q.dead, func(m *sdk.Message) bool {
			if want[m.ID] {
				picked = append(picked, m)
				delete(q.deadSeq, m)
				return true
			}
			return false
		})
		q.releaseDead()
	}
	q.mu.Unlock()

	// The target is q, whose dead letters these are: never a header value,
	// which a message could carry forged.
	for _, m := range picked { // each m is the broker's own copy: reuse it
		sdk.PrepareRedrive(m, queue)
		e := &entry{msg: *m}
		q.mu.Lock()
		now := time.Now()
		q.promote(now, b.maxDeliveries)
		q.makeReady(e, now)
		q.mu.Unlock()
	}
	return len(picked), nil
}

// releaseDead lets the dead-letter list and its cursor map go once the
// list is empty: a Go map never shrinks, and a burst's would be kept for
// the life of the queue. Called with q.mu held.
func (q *queue) releaseDead() {
	if len(q.dead) == 0 {
		q.dead, q.deadSeq = nil, nil
	}
}

// PurgeDeadLetters deletes queue's dead letters and returns how many.
func (b *Broker) PurgeDeadLetters(_ context.Context, queue string) (int, error) {
	q, err := b.deadQueue(queue)
	if err != nil || q == nil {
		return 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.promote(time.Now(), b.maxDeliveries)
	n := len(q.dead)
	q.dead, q.deadSeq = nil, nil
	return n, nil
}

// CountDeadLetters returns how many of queue's dead letters have the
// message ID id: [Broker.RedriveDeadLetters] and
// [Broker.DeleteDeadLetters] given id move every one of them.
func (b *Broker) CountDeadLetters(_ context.Context, queue, id string) (int, error) {
	q, err := b.deadQueue(queue)
	if err != nil || q == nil {
		return 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.promote(time.Now(), b.maxDeliveries)
	n := 0
	for _, m := range q.dead {
		if m.ID == id {
			n++
		}
	}
	return n, nil
}

// CountDeadLettersByID returns, for each of ids that dead letters of queue
// hold, how many do (an ID none holds is left out): what
// [Broker.CountDeadLetters] returns for each, in one pass under the queue's
// lock.
func (b *Broker) CountDeadLettersByID(_ context.Context, queue string, ids []string) (map[string]int, error) {
	q, err := b.deadQueue(queue)
	if err != nil || q == nil {
		return map[string]int{}, err
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	n := make(map[string]int, len(ids))
	q.mu.Lock()
	defer q.mu.Unlock()
	q.promote(time.Now(), b.maxDeliveries)
	for _, m := range q.dead {
		if want[m.ID] {
			n[m.ID]++
		}
	}
	return n, nil
}
