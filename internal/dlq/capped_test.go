package dlq_test

import (
	"context"
	"testing"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// A change by IDs capped at the count an operator confirmed (Options.Limit,
// as the CLI and the dashboard set it) still looks up the named IDs past the
// cap, to name those that are not dead letters. Before, Apply stopped
// looking once Limit had matched: a missing ID named after the found ones
// was never reported, and the change looked complete.
func TestCappedApplyNamesMissingIDs(t *testing.T) {
	s := &sharedIDRedriver{letters: []*sdk.Message{{ID: "a"}, {ID: "b"}}}
	r, err := dlq.Apply(context.Background(), s, "q", dlq.Filter{IDs: []string{"a", "no-such-id"}}, dlq.Redrive, dlq.Options{Limit: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Done != 1 || s.moved != 1 {
		t.Errorf("done %d, moved %d; want the one dead letter named", r.Done, s.moved)
	}
	if r.Missed != 1 || len(r.Failed) != 1 || r.Failed[0].ID != "no-such-id" {
		t.Errorf("missed %d, failed %+v; want no-such-id named", r.Missed, r.Failed)
	}
}
