package memory

import (
	"context"
	"sort"
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
	return "memory: no dead letter " + sdk.ErrorText(e.id) + " in queue " + sdk.ErrorText(e.queue)
}

func (e *notFoundError) Unwrap() error { return sdk.ErrNotFound }

// RedriveDeadLetters puts the dead letters with the given ids (all of them
// when none is given) back on queue, the queue they were dead-lettered from
// (not a queue a header names), ready
// now, with attempts reset and [sdk.HeaderRedriveCount] incremented. It
// returns how many it redrove; an unknown id is an error wrapping
// [sdk.ErrNotFound], and then nothing is redriven.
//
// It moves the letters that were dead when it began (one dead-lettered
// again meanwhile stays dead), oldest first, up to redriveBatchLen of them per
// hold of the queue's lock: a huge dead-letter queue does not hold up the
// queue's Receive and Publish calls for the whole redrive, and each letter
// leaves the dead-letter list and joins the ready messages under one hold,
// so that [Broker.Stats] counts it in exactly one of the two at any
// instant. A letter deleted or purged meanwhile is not redriven, nor
// counted.
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
	var want map[string]bool
	if len(ids) > 0 {
		want = make(map[string]bool, len(ids))
		for _, id := range ids {
			want[id] = true
		}
	}
	q.mu.Lock()
	q.promote(time.Now(), b.maxDeliveries) // a poison message whose last lease ran out is a dead letter
	if want != nil {
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
	}
	// The letters dead now are numbered up to deadNext; those dead-lettered
	// from here on, the redriven ones included, come after it.
	upTo, after := q.deadNext, uint64(0)
	n := 0
	for {
		moved, more := q.redriveBatch(queue, want, &after, upTo, b.maxDeliveries)
		n += moved
		q.mu.Unlock()
		if !more {
			return n, nil
		}
		q.mu.Lock()
	}
}

// redriveBatch is one step of RedriveDeadLetters, under q.mu: it moves to
// the ready messages up to redriveBatchLen dead letters numbered after *after
// and up to upTo whose ID want holds (every one when want is nil), sets
// *after to the last letter it looked at, and reports how many it moved
// and whether letters up to upTo are left to look at.
func (q *queue) redriveBatch(queue string, want map[string]bool, after *uint64, upTo uint64, maxDeliveries int) (moved int, more bool) {
	now := time.Now()
	q.promote(now, maxDeliveries) // the redriven letters become ready after what is due
	i := sort.Search(len(q.dead), func(i int) bool { return q.deadSeq[q.dead[i]] > *after })
	kept, j := i, i
	for ; j < len(q.dead) && moved < redriveBatchLen; j++ {
		m := q.dead[j]
		seq := q.deadSeq[m]
		if seq > upTo {
			break
		}
		*after = seq
		if want != nil && !want[m.ID] {
			q.dead[kept] = m
			kept++
			continue
		}
		delete(q.deadSeq, m)
		// The target is q, whose dead letters these are: never a header
		// value, which a message could carry forged. m is the broker's own
		// copy, off the list now: reuse it.
		sdk.PrepareRedrive(m, queue)
		q.makeReady(&entry{msg: *m}, now)
		moved++
	}
	more = j < len(q.dead) && q.deadSeq[q.dead[j]] <= upTo
	switch {
	case kept == 0:
		// A run from the oldest letter on (a whole-queue redrive): drop it
		// from the front, without moving the letters behind it.
		clear(q.dead[:j])
		q.dead = q.dead[j:]
	case kept < j:
		k := copy(q.dead[kept:], q.dead[j:])
		clear(q.dead[kept+k:])
		q.dead = q.dead[:kept+k]
	}
	q.releaseDead()
	return moved, more
}

// redriveBatchLen bounds the dead letters one hold of a queue's lock
// redrives (RedriveDeadLetters): the queue's Receive, Publish and Stats
// calls wait for one batch at most, not for the whole redrive.
const redriveBatchLen = 1024

// releaseDead lets the dead-letter list and its cursor map go once the
// list is empty, and moves them to a list and a map of their size once
// the list holds under a shrinkRatio-th of the most it held since they
// were made (and that was above shrinkAbove): a Go map never shrinks, and
// a burst's would be kept, with the list's array, for the life of the
// queue whenever a few letters stay. Called with q.mu held.
func (q *queue) releaseDead() {
	switch n := len(q.dead); {
	case n == 0:
		q.dead, q.deadSeq, q.deadPeak = nil, nil, 0
	case q.deadPeak > shrinkAbove && n < q.deadPeak/shrinkRatio:
		dead := make([]*sdk.Message, n, 2*n)
		copy(dead, q.dead)
		seq := make(map[*sdk.Message]uint64, n)
		for _, m := range dead {
			seq[m] = q.deadSeq[m]
		}
		q.dead, q.deadSeq, q.deadPeak = dead, seq, n
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
	q.dead, q.deadSeq, q.deadPeak = nil, nil, 0
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
