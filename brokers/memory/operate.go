package memory

import (
	"context"
	"errors"
	"math"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/berthq/berth/sdk"
)

// numberDead gives the dead letter m just appended its position, which
// DeadLetterPage cursors use. Called with q.mu held.
func (q *queue) numberDead(m *sdk.Message) {
	if q.deadSeq == nil {
		q.deadSeq = make(map[*sdk.Message]uint64)
	}
	q.deadNext++
	q.deadSeq[m] = q.deadNext
	q.deadPeak = max(q.deadPeak, len(q.deadSeq))
}

// Queues returns the names of the queues used so far (published to,
// received from or declared), sorted.
func (b *Broker) Queues(context.Context) ([]string, error) {
	if b.closed.Load() {
		return nil, sdk.ErrClosed
	}
	var names []string
	b.queues.Range(func(k, _ any) bool { names = append(names, k.(string)); return true })
	slices.Sort(names)
	return names, nil
}

// DeadLetterPage returns copies of up to limit (default
// [sdk.DefaultListLimit]) of queue's dead letters after cursor, oldest first,
// and the cursor of the next page ("" when this page is the last). An empty
// cursor starts at the oldest. A cursor stays valid while the dead letters
// it passed are redriven or deleted; a message dead-lettered after the walk
// started comes at its end.
func (b *Broker) DeadLetterPage(_ context.Context, queue, cursor string, limit int) ([]*sdk.Message, string, error) {
	return b.deadLetterPage(queue, cursor, math.MaxUint64, limit)
}

// DeadLetterMark returns a mark of the dead letters queue holds now (the
// position of the last one), for [Broker.DeadLetterPageTo]: "" when it
// holds none.
func (b *Broker) DeadLetterMark(_ context.Context, queue string) (string, error) {
	q, err := b.deadQueue(queue)
	if err != nil || q == nil {
		return "", err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.promote(time.Now(), b.maxDeliveries)
	if len(q.dead) == 0 {
		return "", nil
	}
	return strconv.FormatUint(q.deadSeq[q.dead[len(q.dead)-1]], 10), nil
}

// DeadLetterPageTo is [Broker.DeadLetterPage] restricted to the dead
// letters at or before mark (from [Broker.DeadLetterMark]): a message
// dead-lettered after the mark was taken, even one dead-lettered before
// and redriven meanwhile, is not returned. The cursor of the next page is
// "" after the last page that reaches the mark; the mark "" returns none
// (after Close, [sdk.ErrClosed], as every call does).
func (b *Broker) DeadLetterPageTo(_ context.Context, queue, cursor, mark string, limit int) ([]*sdk.Message, string, error) {
	if _, err := b.deadQueue(queue); err != nil || mark == "" {
		return nil, "", err // closed, or a bad name, is an error whatever the mark
	}
	upTo, err := strconv.ParseUint(mark, 10, 64)
	if err != nil {
		return nil, "", errors.New("memory: invalid dead-letter mark")
	}
	return b.deadLetterPage(queue, cursor, upTo, limit)
}

// deadLetterPage is DeadLetterPage of the dead letters numbered up to upTo.
func (b *Broker) deadLetterPage(queue, cursor string, upTo uint64, limit int) ([]*sdk.Message, string, error) {
	q, err := b.deadQueue(queue)
	if err != nil || q == nil {
		return nil, "", err
	}
	var after uint64
	if cursor != "" {
		if after, err = strconv.ParseUint(cursor, 10, 64); err != nil {
			return nil, "", errors.New("memory: invalid dead-letter page cursor")
		}
	}
	if limit <= 0 {
		limit = sdk.DefaultListLimit
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.promote(time.Now(), b.maxDeliveries)
	i := sort.Search(len(q.dead), func(i int) bool { return q.deadSeq[q.dead[i]] > after })
	stop := sort.Search(len(q.dead), func(i int) bool { return q.deadSeq[q.dead[i]] > upTo })
	if stop < i {
		stop = i
	}
	end := i + min(stop-i, limit) // not i+limit: a limit of MaxInt would overflow
	out := make([]*sdk.Message, 0, end-i)
	for _, m := range q.dead[i:end] {
		out = append(out, m.Clone())
	}
	next := ""
	if end < stop {
		next = strconv.FormatUint(q.deadSeq[q.dead[end-1]], 10)
	}
	return out, next, nil
}

// DeleteDeadLetters deletes the dead letters of queue with the given ids and
// returns how many. An unknown id is an error wrapping [sdk.ErrNotFound], and
// then nothing is deleted. With no ids it deletes nothing.
func (b *Broker) DeleteDeadLetters(_ context.Context, queue string, ids ...string) (int, error) {
	q, err := b.deadQueue(queue)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	if q == nil {
		return 0, notFound(queue, ids[0])
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.promote(time.Now(), b.maxDeliveries)
	found := make(map[string]bool, len(ids))
	for _, m := range q.dead {
		if want[m.ID] {
			found[m.ID] = true
		}
	}
	for _, id := range ids {
		if !found[id] {
			return 0, notFound(queue, id)
		}
	}
	n := 0
	q.dead = slices.DeleteFunc(q.dead, func(m *sdk.Message) bool {
		if want[m.ID] {
			delete(q.deadSeq, m)
			n++
			return true
		}
		return false
	})
	q.releaseDead()
	return n, nil
}
