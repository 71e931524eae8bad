package dlq_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// sameFailures reports how the IDs a preview would hold back (got) differ
// from the failures the change reported (want): by ID and error text, in
// order. "" when they agree.
func sameFailures(got, want []dlq.Failure) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d withheld IDs, want %d (the change's failures)", len(got), len(want))
	}
	for i := range got {
		if got[i].ID != want[i].ID || got[i].Err == nil || got[i].Err.Error() != want[i].Err.Error() {
			return fmt.Sprintf("withheld ID %d: %q (%v), want %q (%v)", i, got[i].ID, got[i].Err, want[i].ID, want[i].Err)
		}
	}
	return ""
}

// A preview of a change chosen by a filter counted the letters the change
// would hold back (Withheld) but did not name them, so -dry-run, the
// confirmation and the API's dry run could not say which IDs would be left.
// It names each now (Summary.WithheldIDs), with the Failure the change
// reports for it. Before, WithheldIDs did not exist.
func TestPreviewNamesWithheldIDs(t *testing.T) {
	check := func(t *testing.T, dl sdk.DeadLetters, queue string) {
		ctx := context.Background()
		f := dlq.Filter{Types: []string{"x"}}
		s, _, _, err := dlq.Preview(ctx, dl, queue, f, dlq.Options{}, 10)
		if err != nil || s.Withheld != 1 {
			t.Fatalf("preview: %+v, %v; want 1 withheld", s, err)
		}
		r, err := dlq.Apply(ctx, dl, queue, f, dlq.Redrive, dlq.Options{Limit: s.Matched}, nil)
		if err != nil || len(r.Failed) != 1 {
			t.Fatalf("apply: %+v, %v; want dup failed", r, err)
		}
		if d := sameFailures(s.WithheldIDs, r.Failed); d != "" {
			t.Error(d)
		}
		if r.WithheldIDs != nil {
			t.Errorf("Apply's Summary.WithheldIDs: %v, want nil (its Failed names them)", r.WithheldIDs)
		}
	}
	letters := []*sdk.Message{{ID: "dup", Type: "x"}, {ID: "dup", Type: "y"}, {ID: "own", Type: "x"}}
	brokers(t, func(t *testing.T, b broker) {
		deadLetterAll(t, b, "billing", letters...)
		check(t, b, "billing")
	})
	t.Run("scan", func(t *testing.T) { // neither Pager nor Sweeper: SQS
		check(t, &streamScanner{dead: letters}, "billing")
	})
}

// The IDs a preview names are bounded, as Apply's failures are: at most
// dlq.MaxFailures, while Withheld counts every letter held back.
func TestPreviewNamesAtMostMaxFailuresWithheldIDs(t *testing.T) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n := dlq.MaxFailures + 5
	var ms []*sdk.Message
	for i := range n {
		id := fmt.Sprintf("id-%03d", i)
		ms = append(ms, &sdk.Message{ID: id, Type: "x"}, &sdk.Message{ID: id, Type: "y"})
	}
	deadLetterAll(t, b, "billing", ms...)
	ctx := context.Background()
	f := dlq.Filter{Types: []string{"x"}}
	s, _, _, err := dlq.Preview(ctx, b, "billing", f, dlq.Options{PageSize: 40}, 0)
	if err != nil || s.Matched != n || s.Withheld != n {
		t.Fatalf("preview: matched %d, withheld %d, %v; want %d and %d", s.Matched, s.Withheld, err, n, n)
	}
	r, err := dlq.Apply(ctx, b, "billing", f, dlq.Redrive, dlq.Options{PageSize: 40, Limit: s.Matched}, nil)
	if err != nil || r.Missed != n {
		t.Fatalf("apply: missed %d, %v; want %d", r.Missed, err, n)
	}
	if d := sameFailures(s.WithheldIDs, r.Failed); d != "" {
		t.Error(d)
	}
}
