package dlq_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// pagedShared is a paging broker's dead letters (dlq.Pager) of which
// several share the empty ID, as RabbitMQ messages a producer outside
// berth published without a message-id do: GetDeadLetter finds the first
// of them, and a change of the empty ID moves them all.
type pagedShared struct{ letters []*sdk.Message }

func (p *pagedShared) ListDeadLetters(context.Context, string, int) ([]*sdk.Message, error) {
	return p.letters, nil
}

func (p *pagedShared) GetDeadLetter(_ context.Context, _, id string) (*sdk.Message, error) {
	for _, m := range p.letters {
		if m.ID == id {
			return m, nil
		}
	}
	return nil, sdk.ErrNotFound
}

func (p *pagedShared) DeadLetterPage(_ context.Context, _, cursor string, limit int) ([]*sdk.Message, string, error) {
	from, _ := strconv.Atoi(cursor)
	to := min(from+limit, len(p.letters))
	next := ""
	if to < len(p.letters) {
		next = strconv.Itoa(to)
	}
	return p.letters[from:to], next, nil
}

func (p *pagedShared) RedriveDeadLetters(context.Context, string, ...string) (int, error) {
	return 0, nil
}

func (p *pagedShared) PurgeDeadLetters(context.Context, string) (int, error) { return 0, nil }

// A selection naming the empty ID chooses every dead letter that has it: a
// broker's redrive or delete of that ID moves them all. Preview, which the
// berth CLI's confirmation (and its -dry-run) counts with, and whose count
// it then sets as the change's limit, must count each of them, on a broker
// that pages too; before, it looked the ID up once (GetDeadLetter) and
// counted one letter, so "purge 1 dead letter(s)?" deleted three.
func TestPreviewCountsEachLetterOfTheEmptyID(t *testing.T) {
	p := &pagedShared{letters: []*sdk.Message{{ID: ""}, {ID: "a"}, {ID: ""}, {ID: "b"}, {ID: ""}}}
	s, first, missing, err := dlq.Preview(t.Context(), p, "q", dlq.Filter{IDs: []string{"", "b", "gone"}}, dlq.Options{PageSize: 2}, 10)
	if err != nil {
		t.Fatal(err)
	}
	// The sample holds a letter of each chosen ID (eachID keeps one).
	if s.Matched != 4 || len(first) != 2 {
		t.Errorf("matched %d (sample %d), want 4 (sample 2): the 3 letters of the empty ID and b", s.Matched, len(first))
	}
	if len(missing) != 1 || missing[0] != "gone" {
		t.Errorf("missing %q, want [gone]", missing)
	}
}
