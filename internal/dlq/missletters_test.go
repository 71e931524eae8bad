package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// goneBeforeRedrive is a broker on which another operator deletes every
// dead letter holding gone just before the first redrive. With oneByOne it
// redrives as the SQS broker does: the IDs it finds, reporting the others
// in an error wrapping sdk.ErrNotFound with the count it moved; else as
// the memory and PostgreSQL brokers do, all of a call or none of it.
type goneBeforeRedrive struct {
	counts
	gone     string
	oneByOne bool
	done     bool
}

func (g *goneBeforeRedrive) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	if !g.done {
		g.done = true
		if _, err := g.DeleteDeadLetters(ctx, queue, g.gone); err != nil {
			return 0, err
		}
	}
	if !g.oneByOne {
		return g.broker.RedriveDeadLetters(ctx, queue, ids...)
	}
	n := 0
	var missing []string
	for _, id := range ids {
		k, err := g.broker.RedriveDeadLetters(ctx, queue, id)
		switch {
		case errors.Is(err, sdk.ErrNotFound):
			missing = append(missing, id)
		case err != nil:
			return n, err
		}
		n += k
	}
	if len(missing) > 0 {
		return n, fmt.Errorf("dead letters %s: %w", strings.Join(missing, ", "), sdk.ErrNotFound)
	}
	return n, nil
}

// A change of chosen IDs counts its letters (Matched: an ID counts every
// letter holding it), and the letters it did not move in Missed, as a
// change chosen by a filter does: when the two letters holding dup are
// gone by the time they are redriven, both are missed (Matched 3 = Done 1
// + Missed 2), named once by dup. Before, applyIDs counted the IDs not
// moved (Result.missPage: len(ids)-n; one an ID retried alone), so the CLI
// and the dashboard said 1 of the 3 confirmed was not redriven, and 1 was
// unaccounted for.
func TestChangeOfIDsCountsMissedLetters(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		for _, oneByOne := range []bool{false, true} {
			t.Run(fmt.Sprintf("one by one %v", oneByOne), func(t *testing.T) {
				ctx := context.Background()
				queue := fmt.Sprintf("billing-%v", oneByOne)
				deadLetterTwice(t, b, queue, "dup") // dup, dup, own
				f := dlq.Filter{IDs: []string{"own", "dup"}}
				s, _, _, err := dlq.Preview(ctx, b, queue, f, dlq.Options{}, 0)
				if err != nil || s.Matched != 3 {
					t.Fatalf("preview: %+v, %v; want 3 matched", s, err)
				}
				r, err := dlq.Apply(ctx, &goneBeforeRedrive{counts: counts{b}, gone: "dup", oneByOne: oneByOne}, queue, f, dlq.Redrive, dlq.Options{Limit: s.Matched}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if r.Matched != 3 || r.Done != 1 || r.Missed != 2 {
					t.Errorf("Matched %d, Done %d, Missed %d; want 3, 1 and 2 (the two letters of dup)", r.Matched, r.Done, r.Missed)
				}
				if !oneByOne && (len(r.Failed) != 1 || r.Failed[0].ID != "dup" || !errors.Is(r.Failed[0].Err, sdk.ErrNotFound) || r.Unnamed() != 0) {
					t.Errorf("Failed %v, Unnamed %d; want dup named for its two letters", r.Failed, r.Unnamed())
				}
				if oneByOne && (len(r.Failed) != 0 || r.Unnamed() != 2) {
					// The broker moved some: it does not say which of the
					// IDs it did not find (its error does).
					t.Errorf("Failed %v, Unnamed %d; want none named, 2 unnamed", r.Failed, r.Unnamed())
				}
				if st, _ := b.Stats(ctx, queue); st.DeadLettered != 0 {
					t.Errorf("%d dead letters left, want none", st.DeadLettered)
				}
			})
		}
	})
}
