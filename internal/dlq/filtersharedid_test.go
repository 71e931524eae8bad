package dlq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// deadLetterAll publishes ms on queue and dead-letters them, in order.
func deadLetterAll(t *testing.T, b sdk.Broker, queue string, ms ...*sdk.Message) {
	t.Helper()
	ctx := context.Background()
	for _, m := range ms {
		if err := b.Publish(ctx, queue, m); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Receive(ctx, queue, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("receive: %d, %v", len(ds), err)
		}
		if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
			t.Fatal(err)
		}
	}
}

// A change chosen by a filter alone (no IDs) moves its letters by ID, and
// brokers move every letter holding an ID they are given: a letter the
// filter did not choose (another type, or past -limit) that shares a chosen
// letter's ID was moved with it, beyond the count confirmed. Such an ID is
// held back now, named (dlq.ErrSharedID) and counted in Missed, and the
// preview the change is confirmed with says so (Withheld). Before, the
// redrive of -type x moved both letters holding "dup".
//
// It runs on the brokers as they are (dlq.IDsCounter: one count a page)
// and with only dlq.IDCounter (one count an ID).
func TestFilterLeavesIDSharedWithUnchosenLetters(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		t.Run("batched", func(t *testing.T) { filterLeavesSharedID(t, b, "a-") })
		t.Run("per ID", func(t *testing.T) { filterLeavesSharedID(t, perIDCounter{b, b.(dlq.IDCounter)}, "b-") })
	})
}

// perIDCounter is a broker with dlq.IDCounter but not dlq.IDsCounter.
type perIDCounter struct {
	broker
	c dlq.IDCounter
}

func (p perIDCounter) CountDeadLetters(ctx context.Context, queue, id string) (int, error) {
	return p.c.CountDeadLetters(ctx, queue, id)
}

func filterLeavesSharedID(t *testing.T, b broker, prefix string) {
	billing, refunds := prefix+"billing", prefix+"refunds"
	{
		ctx := context.Background()
		deadLetterAll(t, b, billing,
			&sdk.Message{ID: "dup", Type: "x"}, &sdk.Message{ID: "dup", Type: "y"}, &sdk.Message{ID: "own", Type: "x"})
		f := dlq.Filter{Types: []string{"x"}}
		s, first, _, err := dlq.Preview(ctx, b, billing, f, dlq.Options{}, 10)
		if err != nil {
			t.Fatal(err)
		}
		if s.Matched != 2 || s.Withheld != 1 || len(first) != 1 || first[0].ID != "own" {
			t.Errorf("preview: %+v, first %d; want 2 matched, 1 withheld, own shown", s, len(first))
		}
		r, err := dlq.Apply(ctx, b, billing, f, dlq.Redrive, dlq.Options{Limit: s.Matched}, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := b.Stats(ctx, billing)
		if st.DeadLettered != 2 {
			t.Errorf("%d dead letters left, want the 2 holding dup (the change chose one of them)", st.DeadLettered)
		}
		if r.Done != 1 || r.Missed != 1 || r.Withheld != 1 || len(r.Failed) != 1 || r.Failed[0].ID != "dup" || !errors.Is(r.Failed[0].Err, dlq.ErrSharedID) {
			t.Errorf("result %+v; want own redriven, dup named as shared", r)
		}
		// -limit 1 chooses the first dup letter of two that match: the
		// second lies past the limit, and a change of dup would move it.
		deadLetterAll(t, b, refunds, &sdk.Message{ID: "dup", Type: "x"}, &sdk.Message{ID: "dup", Type: "x"})
		s, _, _, err = dlq.Preview(ctx, b, refunds, f, dlq.Options{Limit: 1}, 10)
		if err != nil || s.Matched != 1 || s.Withheld != 1 {
			t.Errorf("preview with limit 1: %+v, %v; want 1 matched, withheld", s, err)
		}
		r, err = dlq.Apply(ctx, b, refunds, f, dlq.Delete, dlq.Options{Limit: 1}, nil)
		if err != nil || r.Done != 0 || r.Missed != 1 || len(r.Failed) != 1 || !errors.Is(r.Failed[0].Err, dlq.ErrSharedID) {
			t.Errorf("delete with limit 1: %+v, %v; want nothing done, dup named", r, err)
		}
		if st, _ := b.Stats(ctx, refunds); st.DeadLettered != 2 {
			t.Errorf("%d dead letters left, want 2", st.DeadLettered)
		}
		// Both chosen, on different pages: moved together, once the
		// second is met.
		s, _, _, err = dlq.Preview(ctx, b, refunds, f, dlq.Options{PageSize: 1}, 10)
		if err != nil || s.Matched != 2 || s.Withheld != 0 {
			t.Errorf("preview of both: %+v, %v; want 2 matched, none withheld", s, err)
		}
		r, err = dlq.Apply(ctx, b, refunds, f, dlq.Delete, dlq.Options{PageSize: 1, Limit: s.Matched}, nil)
		if err != nil || r.Done != 2 || r.Missed != 0 || r.Matched != 2 {
			t.Errorf("delete of both: %+v, %v; want both done", r, err)
		}
		if st, _ := b.Stats(ctx, refunds); st.DeadLettered != 0 {
			t.Errorf("%d dead letters left, want none", st.DeadLettered)
		}
	}
}

// purgedFirst is a broker on which another operator deletes the dead
// letter gone just before the first redrive.
type purgedFirst struct {
	broker
	gone string
	done bool
}

func (p *purgedFirst) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	if !p.done {
		p.done = true
		if _, err := p.DeleteDeadLetters(ctx, queue, p.gone); err != nil {
			return 0, err
		}
	}
	return p.broker.RedriveDeadLetters(ctx, queue, ids...)
}

// A page whose redrive finds a letter gone is redriven ID by ID: an ID two
// chosen letters of the page hold is redriven once (both letters), and only
// the gone letter is missed. Before, the ID was tried again for its second
// letter, found gone, and counted missed and named as not found.
func TestGoneLetterBesideSharedID(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		ctx := context.Background()
		deadLetterAll(t, b, "billing",
			&sdk.Message{ID: "dup", Type: "x"}, &sdk.Message{ID: "dup", Type: "x"}, &sdk.Message{ID: "own", Type: "x"}, &sdk.Message{ID: "other", Type: "y"})
		r, err := dlq.Apply(ctx, &purgedFirst{broker: b, gone: "own"}, "billing", dlq.Filter{Types: []string{"x"}}, dlq.Redrive, dlq.Options{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Done != 2 || r.Missed != 1 || len(r.Failed) != 1 || r.Failed[0].ID != "own" || !errors.Is(r.Failed[0].Err, sdk.ErrNotFound) {
			t.Errorf("result %+v; want both dup letters redriven, own missed", r)
		}
		if st, _ := b.Stats(ctx, "billing"); st.DeadLettered != 1 {
			t.Errorf("%d dead letters left, want other", st.DeadLettered)
		}
	})
}

// countingBroker counts the calls of dlq.IDsCounter and dlq.IDCounter.
type countingBroker struct {
	broker
	batches, single int
}

func (c *countingBroker) CountDeadLettersByID(ctx context.Context, queue string, ids []string) (map[string]int, error) {
	c.batches++
	return c.broker.(dlq.IDsCounter).CountDeadLettersByID(ctx, queue, ids)
}

func (c *countingBroker) CountDeadLetters(ctx context.Context, queue, id string) (int, error) {
	c.single++
	return c.broker.(dlq.IDCounter).CountDeadLetters(ctx, queue, id)
}

// A change chosen by a filter counts its letters' IDs with one call a page
// (dlq.IDsCounter), not one a letter; with no filter and no limit (every
// letter chosen) it counts none.
func TestFilterCountsIDsOnceAPage(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		ctx := context.Background()
		deadLetterAll(t, b, "billing", &sdk.Message{ID: "a", Type: "x"}, &sdk.Message{ID: "b", Type: "x"},
			&sdk.Message{ID: "c", Type: "x"}, &sdk.Message{ID: "d", Type: "y"})
		c := &countingBroker{broker: b}
		r, err := dlq.Apply(ctx, c, "billing", dlq.Filter{Types: []string{"x"}}, dlq.Redrive, dlq.Options{PageSize: 2}, nil)
		if err != nil || r.Done != 3 || r.Missed != 0 {
			t.Fatalf("redrive: %+v, %v", r, err)
		}
		if c.batches != 2 || c.single != 0 {
			t.Errorf("%d batched and %d single counts for 2 pages; want 2 and 0", c.batches, c.single)
		}
		*c = countingBroker{broker: b}
		if r, err := dlq.Apply(ctx, c, "billing", dlq.Filter{}, dlq.Delete, dlq.Options{PageSize: 2}, nil); err != nil || r.Done != 1 {
			t.Fatalf("purge: %+v, %v", r, err)
		}
		if c.batches != 0 || c.single != 0 {
			t.Errorf("%d batched and %d single counts for a purge of all; want none", c.batches, c.single)
		}
	})
}
