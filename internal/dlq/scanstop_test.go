package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// stoppedScanner is a broker seen as SQS is (no Pager, no Sweeper): a call
// for several IDs fails with sdk.ErrNotFound and moves nothing, as an SQS
// delete does when one ID is missing, and the call for one ID (blocked)
// ends with the *sqs.ScanError of a scan that could not see every letter
// (letters held by another reader, or queued behind its own in a FIFO
// group). The others are moved one by one.
type stoppedScanner struct {
	dead    []*sdk.Message
	blocked string
	moved   []string
}

func (s *stoppedScanner) ListDeadLetters(_ context.Context, _ string, limit int) ([]*sdk.Message, error) {
	return s.dead[:min(limit, len(s.dead))], nil
}

func (s *stoppedScanner) GetDeadLetter(_ context.Context, _, id string) (*sdk.Message, error) {
	for _, m := range s.dead {
		if m.ID == id {
			return m, nil
		}
	}
	return nil, sdk.ErrNotFound
}

func (s *stoppedScanner) move(ids []string) (int, error) {
	if len(ids) > 1 {
		return 0, fmt.Errorf("dead letters %s: %w", strings.Join(ids, ", "), sdk.ErrNotFound)
	}
	if ids[0] == s.blocked {
		return 0, &sqs.ScanError{Queue: "q", Remaining: 2, Reason: "2 dead letters were held invisible by another reader"}
	}
	s.moved = append(s.moved, ids[0])
	return 1, nil
}

func (s *stoppedScanner) RedriveDeadLetters(_ context.Context, _ string, ids ...string) (int, error) {
	return s.move(ids)
}

func (s *stoppedScanner) DeleteDeadLetters(_ context.Context, _ string, ids ...string) (int, error) {
	return s.move(ids)
}

func (s *stoppedScanner) PurgeDeadLetters(context.Context, string) (int, error) { return 0, nil }

// When a page's broker call reported a letter not found, Apply tries each
// letter of the page alone; a broker scan that stopped before the end on
// one of those calls (SQS's *ScanError) ended the whole Apply with that
// error, as if the broker had failed: the letters after it were not tried,
// and the CLI exited 1 instead of 4 ("the scan stopped before the end").
// It is now a partial result, as the same error is for a whole page: the
// letter is missed, the others are done, and Incomplete says why.
func TestApplyOneByOneScanStopIsPartial(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    dlq.Filter
		act  dlq.Action
	}{
		{"ids redrive", dlq.Filter{IDs: []string{"a", "b", "c"}}, dlq.Redrive},
		{"ids purge", dlq.Filter{IDs: []string{"a", "b", "c"}}, dlq.Delete},
		{"walk redrive", dlq.Filter{Types: []string{"t"}}, dlq.Redrive},
		{"walk purge", dlq.Filter{Types: []string{"t"}}, dlq.Delete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &stoppedScanner{blocked: "b"}
			for _, id := range []string{"a", "b", "c"} {
				b.dead = append(b.dead, &sdk.Message{ID: id, Type: "t"})
			}
			r, err := dlq.Apply(context.Background(), b, "q", tc.f, tc.act, dlq.Options{}, nil)
			if err != nil {
				t.Fatalf("Apply: %v; want a partial result, not an error", err)
			}
			if r.Done != 2 || r.Missed != 1 || strings.Join(b.moved, ",") != "a,c" {
				t.Errorf("Done %d, Missed %d, moved %v; want 2, 1, [a c]", r.Done, r.Missed, b.moved)
			}
			if r.Complete || !strings.Contains(r.Incomplete, "held invisible by another reader") {
				t.Errorf("Complete %v, Incomplete %q; want incomplete, with the scan's reason", r.Complete, r.Incomplete)
			}
			if len(r.Failed) != 1 || r.Failed[0].ID != "b" || !errors.Is(r.Failed[0].Err, sqs.ErrScanIncomplete) {
				t.Errorf("Failed %v; want b, with the scan's error", r.Failed)
			}
		})
	}
}
