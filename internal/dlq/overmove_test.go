package dlq_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// overMover redrives, for each ID it is given, every dead letter holding
// that ID, as the SQS broker's RedriveDeadLetters(ids...) does: duplicates
// (a message dead-lettered twice) share an ID, so a call moves more letters
// than it was given IDs. An ID whose letters are gone by then (vanish:
// found by GetDeadLetter, purged by another operator before the redrive)
// is named in an error wrapping sdk.ErrNotFound, or (held) the call ends
// with the *sqs.ScanError of a scan that could not see it; either comes
// with the count the call moved.
type overMover struct {
	dead   []*sdk.Message
	vanish string
	held   string
	moved  int
}

func (s *overMover) ListDeadLetters(context.Context, string, int) ([]*sdk.Message, error) {
	return nil, nil
}

func (s *overMover) GetDeadLetter(_ context.Context, _, id string) (*sdk.Message, error) {
	if id == s.vanish || id == s.held {
		return &sdk.Message{ID: id, Type: "t"}, nil
	}
	for _, m := range s.dead {
		if m.ID == id {
			return m, nil
		}
	}
	return nil, sdk.ErrNotFound
}

func (s *overMover) RedriveDeadLetters(_ context.Context, _ string, ids ...string) (int, error) {
	n := 0
	var missing []string
	held := false
	for _, id := range ids {
		found := false
		rest := s.dead[:0]
		for _, m := range s.dead {
			if m.ID == id {
				found = true
				n++
				continue
			}
			rest = append(rest, m)
		}
		s.dead = rest
		switch {
		case found:
		case id == s.held:
			held = true
		default:
			missing = append(missing, id)
		}
	}
	s.moved += n
	switch {
	case held:
		return n, &sqs.ScanError{Queue: "q", Remaining: 1, Reason: "1 dead letter was held invisible by another reader"}
	case len(missing) > 0:
		return n, fmt.Errorf("dead letters %s: %w", strings.Join(missing, ", "), sdk.ErrNotFound)
	}
	return n, nil
}

func (s *overMover) PurgeDeadLetters(context.Context, string) (int, error) { return 0, nil }

// A broker call that moved more letters than it was given IDs (it redrives
// every letter sharing a requested ID) and reports another ID not found,
// or its scan stopped: Result.missPage added len(ids)-n to Missed, which
// went negative, and berth dlq redrive reported "-2 missed". Missed is
// never negative.
func TestApplyMissedNeverNegative(t *testing.T) {
	for _, tc := range []struct {
		name         string
		vanish, held string
	}{
		{"another not found", "gone", ""},
		{"scan stopped", "", "gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &overMover{vanish: tc.vanish, held: tc.held}
			for range 4 { // one message dead-lettered four times
				b.dead = append(b.dead, &sdk.Message{ID: "dup", Type: "t"})
			}
			r, err := dlq.Apply(context.Background(), b, "q", dlq.Filter{IDs: []string{"dup", "gone"}}, dlq.Redrive, dlq.Options{}, nil)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if r.Done != b.moved || r.Done != 4 {
				t.Errorf("Done %d; the broker moved %d (want 4)", r.Done, b.moved)
			}
			if r.Missed < 0 {
				t.Errorf("Missed %d, negative", r.Missed)
			}
			if r.Missed < len(r.Failed) {
				t.Errorf("Missed %d, fewer than the %d failures named", r.Missed, len(r.Failed))
			}
		})
	}
}
