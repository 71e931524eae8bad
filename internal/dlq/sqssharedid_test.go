package dlq_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// On a broker that can neither page nor sweep (SQS), a change chosen by a
// filter or -limit moved its letters by ID, and the broker moved every
// letter holding one (the SQS broker redrives or deletes each letter whose
// ID it is given): a letter the filter did not choose, or past -limit, that
// shares a chosen letter's ID was moved with it, beyond the count
// confirmed. The change reads every letter of its scan (without bodies)
// before it moves any, so it counts each ID's letters there and holds such
// an ID back (dlq.ErrSharedID), as the preview it is confirmed with counts
// (Withheld). Before, -type b moved both letters holding "a", and -limit 2
// moved three letters.
func TestStreamedScanLeavesIDSharedWithUnchosenLetters(t *testing.T) {
	for _, tc := range []struct {
		name  string
		f     dlq.Filter
		limit int
	}{
		{"filter", dlq.Filter{Types: []string{"b"}}, 0},
		{"limit", dlq.Filter{}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &streamScanner{dead: []*sdk.Message{
				{ID: "a", Type: "b"}, {ID: "x", Type: "b"}, {ID: "a", Type: "a"},
			}}
			ctx := context.Background()
			p, first, _, err := dlq.Preview(ctx, s, "q", tc.f, dlq.Options{Limit: tc.limit}, 10)
			if err != nil || p.Matched != 2 || p.Withheld != 1 {
				t.Errorf("Preview: %+v, %v; want 2 matched, 1 withheld", p, err)
			}
			if len(first) != 1 || first[0].ID != "x" {
				t.Errorf("Preview's first: %v, want x only", first)
			}
			// The CLI and the dashboard confirm with Limit = p.Matched.
			r, err := dlq.Apply(ctx, s, "q", tc.f, dlq.Redrive, dlq.Options{Limit: 2}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.moved, []string{"x"}) {
				t.Errorf("moved %v, want [x]: a is held by a letter not chosen too", s.moved)
			}
			if r.Done != 1 || r.Missed != 1 || r.Withheld != 1 || r.Matched != 2 ||
				len(r.Failed) != 1 || r.Failed[0].ID != "a" || !errors.Is(r.Failed[0].Err, dlq.ErrSharedID) {
				t.Errorf("Apply: %+v; want 1 done, a missed (ErrSharedID)", r)
			}
		})
	}
}
