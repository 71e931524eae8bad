package dlq

import (
	"context"
	"fmt"

	"github.com/berthq/berth/sdk"
)

// idGuard holds back, in a change chosen by a filter without IDs, the IDs
// that dead letters it did not choose hold too: a broker given an ID moves
// every letter holding it, so moving such an ID would touch letters the
// operator did not choose, and more than the count confirmed. Each page of
// chosen letters is counted by ID in one broker call ([IDsCounter], or one
// [IDCounter] call an ID; on a broker with neither Pager nor Sweeper, from
// the counts of its one scan); an ID held by more letters than were chosen so
// far waits (a letter holding it may be chosen in a later page) and is
// moved once all its letters were chosen; those still waiting when the walk
// ends (or an error stops it) are the change's [ErrSharedID] failures. It
// keeps an entry for each waiting ID: memory grows with the IDs shared with
// letters not chosen.
type idGuard struct {
	count   func(ctx context.Context, ids []string) (map[string]int, error)
	waiting map[string]*heldID
	order   []string // of waiting, in the order they were met
	// totals, on a broker with neither Pager nor Sweeper (SQS), counts
	// the letters of each ID its one scan read (scanned), which count
	// answers from: that scan holds the letters until it ends, so the
	// broker cannot be asked. Its entries are bounded by ScanLimit.
	totals map[string]int
}

// heldID is an ID waiting in an idGuard: chosen of the total letters
// holding it were chosen.
type heldID struct {
	id            string
	chosen, total int
}

// newIDGuard returns the guard of a change of queue's dead letters that f
// chooses, limited to o.Limit; nil when none is needed (f and Limit choose
// every dead letter), on a [Sweeper] (which moves letter by letter), or on
// a [Pager] that cannot count the letters of an ID.
func newIDGuard(dl sdk.DeadLetters, queue string, f Filter, o Options) *idGuard {
	if len(f.IDs) > 0 || (f.IsZero() && o.Limit <= 0) {
		return nil
	}
	g := &idGuard{waiting: map[string]*heldID{}}
	if _, paged := dl.(Pager); !paged {
		if _, sweeps := dl.(Sweeper); sweeps {
			return nil // a sweep moves letter by letter, not by ID
		}
		// One scan reads every letter a change may move (up to
		// ScanLimit): its letters are counted by ID as it reads them
		// (walkMode.count), and a Streamer's scan must not call the
		// broker anyway.
		g.totals = map[string]int{}
		g.count = func(context.Context, []string) (map[string]int, error) { return g.totals, nil }
		return g
	}
	switch c := dl.(type) {
	case IDsCounter:
		g.count = func(ctx context.Context, ids []string) (map[string]int, error) {
			return c.CountDeadLettersByID(ctx, queue, ids)
		}
	case IDCounter:
		g.count = func(ctx context.Context, ids []string) (map[string]int, error) {
			n := make(map[string]int, len(ids))
			for _, id := range ids {
				k, err := c.CountDeadLetters(ctx, queue, id)
				if err != nil {
					return nil, err
				}
				n[id] = k
			}
			return n, nil
		}
	default:
		return nil
	}
	return g
}

// scanned counts the letters of page, read by a scan, by ID (totals).
func (g *idGuard) scanned(page []*sdk.Message) {
	for _, m := range page {
		g.totals[m.ID]++
	}
}

// page returns the IDs of page (the chosen letters of one page of the walk)
// to move now, one for each letter, the letters of earlier pages an ID
// waited with included; the others wait.
func (g *idGuard) page(ctx context.Context, page []*sdk.Message) ([]string, error) {
	chosen := make(map[string]int, len(page))
	var ids, fresh []string // distinct, in order; those not waiting
	for _, m := range page {
		if chosen[m.ID] == 0 {
			ids = append(ids, m.ID)
			if g.waiting[m.ID] == nil {
				fresh = append(fresh, m.ID)
			}
		}
		chosen[m.ID]++
	}
	var total map[string]int
	if len(fresh) > 0 {
		var err error
		if total, err = g.count(ctx, fresh); err != nil {
			return nil, err
		}
	}
	out := make([]string, 0, len(page))
	for _, id := range ids {
		n := chosen[id]
		if h := g.waiting[id]; h != nil {
			h.chosen += n
			if h.chosen < h.total {
				continue
			}
			n = h.chosen // every letter holding it is chosen now
			delete(g.waiting, id)
		} else if t := total[id]; t > n {
			g.waiting[id] = &heldID{id: id, chosen: n, total: t}
			g.order = append(g.order, id)
			continue
		}
		// Its letters are all chosen (or gone since: the broker call
		// reports that).
		for range n {
			out = append(out, id)
		}
	}
	return out, nil
}

// held returns the IDs still waiting, in the order they were met: their
// chosen letters are not moved.
func (g *idGuard) held() []*heldID {
	var out []*heldID
	for _, id := range g.order {
		if h := g.waiting[id]; h != nil {
			out = append(out, h)
			delete(g.waiting, id) // an ID met again after it was moved is listed once
		}
	}
	g.order = nil
	return out
}

// err is the Failure of h's letters; stopped: the change stopped (an
// error) before the end of its walk, which might have chosen the others.
func (h *heldID) err(stopped bool) error {
	chosen := "were chosen"
	if stopped {
		chosen = "had been chosen when the change stopped"
	}
	return fmt.Errorf("%w: %d dead letters hold this ID and only %d of them %s (matched the filter, within the limit), "+
		"but a change of an ID moves every letter holding it; it was not changed: change it by ID to move them all", ErrSharedID, h.total, h.chosen, chosen)
}
