package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// sharedIDRedriver holds dead letters of which several share an ID (foreign
// messages often have none, so share the empty one). A redrive moves the
// chosen letters one by one, in order, and refuses those whose position is
// in refuse: it returns how many it moved, with an *sdk.PublishError naming
// the refused letters by ID (one entry per ID, as the map allows).
type sharedIDRedriver struct {
	letters []*sdk.Message
	refuse  map[int]bool // positions in a call's ids
	moved   int
}

func (s *sharedIDRedriver) ListDeadLetters(context.Context, string, int) ([]*sdk.Message, error) {
	return s.letters, nil
}

func (s *sharedIDRedriver) GetDeadLetter(_ context.Context, _, id string) (*sdk.Message, error) {
	for _, m := range s.letters {
		if m.ID == id {
			return m, nil
		}
	}
	return nil, sdk.ErrNotFound
}

func (s *sharedIDRedriver) RedriveDeadLetters(_ context.Context, _ string, ids ...string) (int, error) {
	n := 0
	failed := map[string]error{}
	for i, id := range ids {
		if s.refuse[i] {
			failed[id] = fmt.Errorf("%w: letter %d refused", sdk.ErrInvalidMessage, i)
			continue
		}
		n++
	}
	s.moved += n
	if len(failed) > 0 {
		return n, &sdk.PublishError{Failed: failed}
	}
	return n, nil
}

func (s *sharedIDRedriver) PurgeDeadLetters(context.Context, string) (int, error) { return 0, nil }

// A redrive whose refused letter shares its ID with a letter that was moved
// counts one letter missed, not two: Done + Missed is never more than the
// letters chosen. Before, every chosen letter whose ID the PublishError
// named was counted missed, so the moved letter sharing the refused one's
// (empty) ID was counted both done and missed, and berth dlq redrive
// reported more letters than there were.
func TestApplyCountsRefusedLettersSharingAnID(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ids        []string
		refuse     []int
		done, miss int
		named      []string
	}{
		{"one of two empty IDs refused", []string{"", "", "x"}, []int{1}, 2, 1, []string{""}},
		{"one of three empty IDs refused, and another", []string{"", "a", "", "", "b"}, []int{2, 4}, 3, 2, []string{"", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &sharedIDRedriver{refuse: map[int]bool{}}
			for _, id := range tc.ids {
				b.letters = append(b.letters, &sdk.Message{ID: id, Type: "t"})
			}
			for _, i := range tc.refuse {
				b.refuse[i] = true
			}
			r, err := dlq.Apply(context.Background(), b, "q", dlq.Filter{Types: []string{"t"}}, dlq.Redrive, dlq.Options{}, nil)
			var pe *sdk.PublishError
			if !errors.As(err, &pe) {
				t.Fatalf("Apply error %v, want the broker's PublishError", err)
			}
			if r.Done != b.moved || r.Done != tc.done {
				t.Errorf("Done %d; the broker moved %d (want %d)", r.Done, b.moved, tc.done)
			}
			if r.Missed != tc.miss {
				t.Errorf("Missed %d, want %d (Done %d of %d letters)", r.Missed, tc.miss, r.Done, len(tc.ids))
			}
			var named []string
			for _, f := range r.Failed {
				named = append(named, f.ID)
			}
			if fmt.Sprintf("%q", named) != fmt.Sprintf("%q", tc.named) {
				t.Errorf("Failed names %q, want %q", named, tc.named)
			}
		})
	}
}
