package sqs_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// DeleteDeadLetters deletes exactly the chosen dead letters, or nothing when
// one of them is missing or the scan would have to hold too many others.
func TestDeleteDeadLetters(t *testing.T) {
	t.Parallel() // each scan ends with a 1 s long poll
	b := newBroker(t, fastOptions())
	q := declare(t, b, "deletedl", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	var ids []string
	for range 4 {
		m := &sdk.Message{ID: sdk.NewID(), Type: "dl", Body: []byte("x")}
		if err := b.Publish(ctx, q+"-dlq", m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}
	left := func() []string {
		t.Helper()
		ms, err := b.ListDeadLetters(ctx, q, 10)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range ms {
			out = append(out, m.ID)
		}
		slices.Sort(out)
		return out
	}
	if n, err := b.DeleteDeadLetters(ctx, q, ids[1], "nope"); n != 0 || !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("with a missing ID: %d, %v; want 0 and ErrNotFound", n, err)
	}
	if got := left(); len(got) != 4 {
		t.Fatalf("a failed delete deleted something: %d left", len(got))
	}
	if n, err := b.DeleteDeadLetters(ctx, q, ids[0], ids[2]); n != 2 || err != nil {
		t.Fatalf("DeleteDeadLetters = %d, %v; want 2", n, err)
	}
	want := []string{ids[1], ids[3]}
	slices.Sort(want)
	if got := left(); !slices.Equal(got, want) {
		t.Fatalf("left %v, want %v", got, want)
	}
	sqs.SetScanLimits(b, 30*time.Second, 1)
	var se *sqs.ScanError
	if n, err := b.DeleteDeadLetters(ctx, q, "nope"); n != 0 || !errors.As(err, &se) || !errors.Is(err, sqs.ErrScanIncomplete) {
		t.Fatalf("past the scan bound: %d, %v; want 0 and a *ScanError", n, err)
	}
	if got := left(); !slices.Equal(got, want) {
		t.Fatalf("an incomplete scan deleted something: left %v", got)
	}
}
