package dlq_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// counts is a broker with the counts of the letters holding an ID that
// the memory and PostgreSQL brokers have (dlq.IDsCounter, dlq.IDCounter),
// for a wrapper of one: broker does not name them.
type counts struct{ broker }

func (c counts) CountDeadLettersByID(ctx context.Context, queue string, ids []string) (map[string]int, error) {
	return c.broker.(dlq.IDsCounter).CountDeadLettersByID(ctx, queue, ids)
}

func (c counts) CountDeadLetters(ctx context.Context, queue, id string) (int, error) {
	return c.broker.(dlq.IDCounter).CountDeadLetters(ctx, queue, id)
}

// failsFrom is a broker whose RedriveDeadLetters fails, as a broker that
// went away does, from its call number from on (1 the first).
type failsFrom struct {
	counts
	from, calls int
}

var errLost = errors.New("broker connection lost")

func (f *failsFrom) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	f.calls++
	if f.calls >= f.from {
		return 0, errLost
	}
	return f.broker.RedriveDeadLetters(ctx, queue, ids...)
}

// A change chosen by a filter that a broker error stops part-way still
// names the IDs it had held back by then (their letters shared with dead
// letters it had not chosen: ErrSharedID), counted in Missed and Withheld,
// so that the operator can tell them from the letters it never reached.
// Before, a stopped Apply named none: Withheld 0, Failed empty, while
// Matched counted the letter.
func TestStoppedApplyNamesWithheldIDs(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		ctx := context.Background()
		// Pages of 2: [dup(x), own(x)] moves own and holds dup back (the
		// letter dup(y) holds it too); [other(x), dup(y)] fails.
		deadLetterAll(t, b, "billing", &sdk.Message{ID: "dup", Type: "x"}, &sdk.Message{ID: "own", Type: "x"},
			&sdk.Message{ID: "other", Type: "x"}, &sdk.Message{ID: "dup", Type: "y"})
		r, err := dlq.Apply(ctx, &failsFrom{counts: counts{b}, from: 2}, "billing", dlq.Filter{Types: []string{"x"}}, dlq.Redrive, dlq.Options{PageSize: 2}, nil)
		if !errors.Is(err, errLost) {
			t.Fatalf("Apply: %v; want the broker's error", err)
		}
		if st, _ := b.Stats(ctx, "billing"); st.DeadLettered != 3 {
			t.Fatalf("%d dead letters left, want 3 (own redriven): %+v %v", st.DeadLettered, r, err)
		}
		if r.Done != 1 || r.Matched != 3 {
			t.Errorf("Done %d, Matched %d; want 1 and 3", r.Done, r.Matched)
		}
		if r.Withheld != 1 || r.Missed != 1 || len(r.Failed) != 1 || r.Failed[0].ID != "dup" || !errors.Is(r.Failed[0].Err, dlq.ErrSharedID) {
			t.Fatalf("Withheld %d, Missed %d, Failed %v; want dup named as held back (ErrSharedID), 1 letter", r.Withheld, r.Missed, r.Failed)
		}
		// Its text says the change stopped: the letters holding dup that
		// it had not chosen may have been chosen further on.
		if msg := r.Failed[0].Err.Error(); !strings.Contains(msg, "2 dead letters hold this ID and only 1 of them had been chosen when the change stopped") {
			t.Errorf("the failure's text %q does not say the change stopped", msg)
		}
		if r.Unnamed() != 0 {
			t.Errorf("Unnamed %d; want 0: dup names its letter", r.Unnamed())
		}
	})
}
