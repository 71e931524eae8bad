package ledger_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// TestOutOfOrderWritesNeverMoveBack writes one job's events in every kind of
// order — shuffled, one batch each, all in one batch, in random splits —
// and checks the row always ends where the in-order history ends: a late
// running never undoes a settlement, a late enqueued never undoes a start.
func TestOutOfOrderWritesNeverMoveBack(t *testing.T) {
	pool := newPool(t)
	s := newStore(t, pool)
	ctx := testCtx(t, 60*time.Second)
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	history := func(id string) []ledger.Event {
		b := ledger.Event{MessageID: id, Queue: "orders", Type: "charge", IdempotencyKey: "k-" + id, CorrelationID: "c-" + id}
		ev := func(st ledger.Status, attempt, i int, mod func(*ledger.Event)) ledger.Event {
			e := b
			e.Status, e.Attempt, e.At = st, attempt, at(i)
			if mod != nil {
				mod(&e)
			}
			return e
		}
		run := func(w string) func(*ledger.Event) {
			return func(e *ledger.Event) { e.StartedAt, e.Worker = e.At, w }
		}
		return []ledger.Event{
			ev(ledger.StatusEnqueued, 0, 0, nil),
			ev(ledger.StatusRunning, 1, 1, run("w1")),
			ev(ledger.StatusRetrying, 1, 2, func(e *ledger.Event) {
				e.Error, e.Class, e.NextAttemptAt, e.Worker = "boom", sdk.ClassTransient, at(3), "w1"
			}),
			ev(ledger.StatusRunning, 2, 3, run("w2")),
			ev(ledger.StatusReleased, 2, 4, func(e *ledger.Event) { e.Worker = "w2" }),
			ev(ledger.StatusRunning, 2, 5, run("w3")),
			ev(ledger.StatusSucceeded, 2, 6, func(e *ledger.Event) { e.Worker, e.Duration = "w3", time.Second }),
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(t *testing.T, id string) {
		t.Helper()
		j, err := s.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.Status != ledger.StatusSucceeded || j.Attempts != 2 || j.Generation != 0 {
			t.Errorf("%s: status %s attempt %d generation %d, want succeeded 2 0", id, j.Status, j.Attempts, j.Generation)
		}
		if !j.FirstSeenAt.Equal(at(0)) || j.Queue != "orders" || j.Type != "charge" || j.IdempotencyKey != "k-"+id || j.CorrelationID != "c-"+id {
			t.Errorf("%s: message fields %+v", id, j)
		}
		if j.Worker != "w3" || !j.FinishedAt.Equal(at(6)) || j.Duration != time.Second {
			t.Errorf("%s: worker %q finished %v duration %v, want w3 %v 1s", id, j.Worker, j.FinishedAt, j.Duration, at(6))
		}
		if len(j.History) != 2 || j.History[0].Status != ledger.StatusRetrying || j.History[0].Error != "boom" ||
			j.History[1].Status != ledger.StatusSucceeded {
			t.Errorf("%s: history %+v, want attempt 1 retrying (boom), attempt 2 succeeded", id, j.History)
		}
	}
	for i := range 30 {
		id := "job-" + suffix()
		evs := history(id)
		rng.Shuffle(len(evs), func(a, b int) { evs[a], evs[b] = evs[b], evs[a] })
		switch i % 3 {
		case 0: // one batch per event
			for _, e := range evs {
				if err := s.Write(ctx, []ledger.Event{e}); err != nil {
					t.Fatal(err)
				}
			}
		case 1: // all in one batch: merged in Go, then guarded in SQL
			if err := s.Write(ctx, evs); err != nil {
				t.Fatal(err)
			}
		case 2: // random splits, each batch written twice (a replay)
			for len(evs) > 0 {
				n := 1 + rng.IntN(len(evs))
				for range 2 {
					if err := s.Write(ctx, evs[:n]); err != nil {
						t.Fatal(err)
					}
				}
				evs = evs[n:]
			}
		}
		check(t, id)
	}

	// A late running after the settlement, and a late release of the same
	// attempt, change nothing.
	id := "job-" + suffix()
	evs := history(id)
	if err := s.Write(ctx, evs); err != nil {
		t.Fatal(err)
	}
	late := []ledger.Event{evs[5], evs[4], evs[1]}
	late[0].At = at(10) // even with a later clock: succeeded is final for its attempt
	if err := s.Write(ctx, late); err != nil {
		t.Fatal(err)
	}
	check(t, id)
}
