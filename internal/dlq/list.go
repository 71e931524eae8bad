package dlq

import (
	"context"
	"math"

	"github.com/berthq/berth/sdk"
)

// Listing is one page of a queue's matching dead letters and the totals.
type Listing struct {
	Messages []*sdk.Message
	// Total is the number of dead letters of the queue (all of them), -1
	// when the broker cannot count them.
	Total int64
	// Matched counts every dead letter the filter matches, not just this
	// page; a lower bound when Complete is false.
	Matched  int
	Complete bool
	// Incomplete says why the walk stopped before the end of the
	// dead-letter queue ("" when it did not): see [Summary.Incomplete].
	Incomplete string
	Offset     int
	// Next is the offset of the next page, -1 on the last.
	Next int
}

// List returns the dead letters of queue that f matches from the offset-th
// match, at most limit of them, and counts every match (a walk over the
// whole dead-letter queue, page by page; with no filter on a broker that
// counts them, the count comes from sdk.Inspector and the walk stops after
// the page).
func List(ctx context.Context, dl sdk.DeadLetters, queue string, f Filter, offset, limit int, o Options) (Listing, error) {
	offset, limit = max(offset, 0), max(limit, 0) // callers refuse negatives; the sums below need it
	l := Listing{Total: -1, Offset: offset, Next: -1}
	// end is the match past the page: offset+limit, or math.MaxInt when
	// that sum would wrap round (a limit or offset that large is no bound),
	// which showed nothing and named the same offset as the next page.
	end := offset + min(limit, math.MaxInt-offset)
	if in, ok := dl.(sdk.Inspector); ok {
		st, err := in.Stats(ctx, queue)
		if err != nil {
			return l, err
		}
		l.Total = st.DeadLettered
	}
	counted := f.IsZero() && l.Total >= 0
	if counted {
		// The page is all it needs: a broker without Pager reads no more
		// than that either, and never more than ScanLimit (its default
		// too), whatever the offset: such a broker holds every letter its
		// one call reads.
		o.Limit = end
		o.ScanLimit = min(o.withDefaults().ScanLimit, end)
	}
	i := 0
	// Streamed ([Streamer]): it keeps only the page it shows, not every
	// dead letter the scan reads.
	s, err := walk(ctx, dl, queue, f, o, walkMode{stream: true}, func(page []*sdk.Message) error {
		for _, m := range page {
			if i >= offset && i < end {
				l.Messages = append(l.Messages, m)
			}
			i++
		}
		return nil
	})
	if err != nil {
		return l, err
	}
	l.Matched, l.Complete, l.Incomplete = s.Matched, s.Complete, s.Incomplete
	// With no filter the broker's count is the number of matches, unless
	// the scan stopped (ScanLimit, or the broker's own scan) before the
	// page it was to read was full: the page is then short, and the
	// letters past the scan cannot be reached, so the listing stays
	// incomplete, with the scan's count, and no next page.
	short := s.Incomplete != "" && int64(offset+len(l.Messages)) < min(int64(end), l.Total)
	if counted && !short {
		l.Matched, l.Complete, l.Incomplete = int(l.Total), true, ""
	}
	if offset+len(l.Messages) < l.Matched {
		l.Next = offset + len(l.Messages)
	}
	return l, nil
}
