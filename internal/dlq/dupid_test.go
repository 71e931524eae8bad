package dlq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// deadLetterTwice dead-letters two messages that share the ID id (a
// producer that reused a message ID) on queue, and one with its own ID.
func deadLetterTwice(t *testing.T, b sdk.Broker, queue, id string) {
	t.Helper()
	ctx := context.Background()
	for _, m := range []*sdk.Message{{ID: id, Type: "t"}, {ID: id, Type: "t"}, {ID: "own", Type: "t"}} {
		if err := b.Publish(ctx, queue, m); err != nil {
			t.Fatal(err)
		}
	}
	for n := 0; n < 3; {
		ds, err := b.Receive(ctx, queue, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
}

// One ID held by two dead letters: the brokers move every letter holding
// an ID they are given, so a change of it touches two. The preview (the
// count the CLI, the dashboard and the API's dry_run confirm) counts both,
// and a change limited to fewer letters than the ID holds (a count
// confirmed before the second was dead-lettered, or by the old count of
// one per ID) moves none of them and says why. Before, the preview counted
// 2 for the 3 letters, and a change limited to 1 moved 3.
//
// It runs on the brokers as they are (dlq.IDCounter) and hiding their
// count (noCounter: the letters are counted by a walk).
func TestSharedIDCountsEveryLetter(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		t.Run("counted", func(t *testing.T) { sharedIDCountsEveryLetter(t, b, "billing") })
		t.Run("walked", func(t *testing.T) { sharedIDCountsEveryLetter(t, noCounter{b}, "refunds") })
	})
}

// noCounter is a broker without dlq.IDCounter.
type noCounter struct{ broker }

func sharedIDCountsEveryLetter(t *testing.T, b broker, queue string) {
	{
		ctx := context.Background()
		deadLetterTwice(t, b, queue, "dup")
		s, first, missing, err := dlq.Preview(ctx, b, queue, dlq.Filter{IDs: []string{"dup", "own", "gone"}}, dlq.Options{}, 10)
		if err != nil {
			t.Fatal(err)
		}
		if s.Matched != 3 || s.Shared != 2 || len(first) != 2 || len(missing) != 1 || missing[0] != "gone" {
			t.Errorf("preview: matched %d (want 3), shared %d (want 2), %d first (want 2), missing %q", s.Matched, s.Shared, len(first), missing)
		}
		// Limit 1, the count one per ID gave "dup": its two letters do
		// not fit, and are not touched; "own" fits.
		r, err := dlq.Apply(ctx, b, queue, dlq.Filter{IDs: []string{"dup", "own"}}, dlq.Delete, dlq.Options{Limit: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := b.Stats(ctx, queue)
		if r.Done > 1 || st.DeadLettered < 2 {
			t.Fatalf("a change limited to 1 letter did %d (%d dead letters left of 3)", r.Done, st.DeadLettered)
		}
		if r.Done != 1 || r.Matched != 1 || r.Complete || r.Missed != 2 || len(r.Failed) != 1 || r.Failed[0].ID != "dup" || !errors.Is(r.Failed[0].Err, dlq.ErrOverLimit) {
			t.Errorf("result %+v; want own done, dup named as over the limit", r)
		}
		if st.DeadLettered != 2 {
			t.Errorf("%d dead letters left, want the 2 holding dup", st.DeadLettered)
		}
		s, _, _, err = dlq.Preview(ctx, b, queue, dlq.Filter{IDs: []string{"dup"}}, dlq.Options{}, 0)
		if err != nil || s.Matched != 2 {
			t.Fatalf("preview of dup: %+v, %v", s, err)
		}
		// The count the preview gives, as confirmed: all three go.
		r, err = dlq.Apply(ctx, b, queue, dlq.Filter{IDs: []string{"dup"}}, dlq.Delete, dlq.Options{Limit: s.Matched}, nil)
		if err != nil || r.Done != 2 || r.Matched != 2 || r.Missed != 0 {
			t.Errorf("change of the confirmed 2: %+v, %v", r, err)
		}
		if st, _ := b.Stats(ctx, queue); st.DeadLettered != 0 {
			t.Errorf("%d dead letters left, want none", st.DeadLettered)
		}
	}
}

// The memory and PostgreSQL brokers count the letters holding an ID
// themselves (dlq.IDCounter), so a preview by IDs does not walk their
// dead-letter queues.
func TestBrokersCountLettersByID(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		ctx := context.Background()
		deadLetterTwice(t, b, "billing", "dup")
		c, ok := any(b).(dlq.IDCounter)
		if !ok {
			t.Fatalf("%T is not a dlq.IDCounter", b)
		}
		for id, want := range map[string]int{"dup": 2, "own": 1, "gone": 0} {
			if n, err := c.CountDeadLetters(ctx, "billing", id); err != nil || n != want {
				t.Errorf("CountDeadLetters(%q) = %d, %v; want %d", id, n, err, want)
			}
		}
		var scanned int
		s, _, _, err := dlq.Preview(ctx, b, "billing", dlq.Filter{IDs: []string{"dup"}}, dlq.Options{Scanned: func(n int) { scanned = n }}, 0)
		if err != nil || s.Matched != 2 || scanned != 1 {
			t.Errorf("preview: %+v %v, %d read; want 2 matched of the 1 looked up", s, err, scanned)
		}
	})
}

// The memory and PostgreSQL brokers count the letters of a page's IDs in
// one call (dlq.IDsCounter), as CountDeadLetters counts each.
func TestBrokersCountLettersByIDs(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		ctx := context.Background()
		deadLetterTwice(t, b, "billing", "dup")
		c, ok := any(b).(dlq.IDsCounter)
		if !ok {
			t.Fatalf("%T is not a dlq.IDsCounter", b)
		}
		got, err := c.CountDeadLettersByID(ctx, "billing", []string{"dup", "own", "gone", "dup", "bad\x00"})
		if err != nil || len(got) != 2 || got["dup"] != 2 || got["own"] != 1 {
			t.Errorf("CountDeadLettersByID = %v, %v; want dup 2, own 1", got, err)
		}
		if got, err := c.CountDeadLettersByID(ctx, "nosuch", []string{"dup"}); err != nil || len(got) != 0 {
			t.Errorf("CountDeadLettersByID of another queue = %v, %v; want none", got, err)
		}
	})
}
