package dlq

import (
	"context"

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
	l := Listing{Total: -1, Offset: offset, Next: -1}
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
		// than that either.
		o.Limit = offset + limit
		o.ScanLimit = max(o.ScanLimit, 0)
		if o.ScanLimit == 0 || o.ScanLimit > offset+limit {
			o.ScanLimit = offset + limit
		}
	}
	i := 0
	s, err := Walk(ctx, dl, queue, f, o, func(page []*sdk.Message) error {
		for _, m := range page {
			if i >= offset && i < offset+limit {
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
	if counted {
		l.Matched, l.Complete, l.Incomplete = int(l.Total), true, ""
	}
	if offset+len(l.Messages) < l.Matched {
		l.Next = offset + len(l.Messages)
	}
	return l, nil
}
