package ledger_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// On a RabbitMQ classic queue a redelivery carries only the redelivered
// flag: however many times a delivery's lease is lost, the next delivery
// has the same attempt (rabbitmq: Attempt() is the attempt header plus
// one). A job whose lease is lost at attempt 2 is then delivered again at
// attempt 2; the lost delivery's retrying (lease_lost, rank 2) outranked
// the new delivery's running (rank 1) of the same attempt, whatever the
// order the events landed in, and the row showed a lost attempt while the
// job ran, until that run settled. Two deliveries of one attempt are told
// apart by their starts: the events of the delivery that started later
// win, unless the attempt already ended succeeded or dead.
func TestLeaseLostTwiceSameAttemptRedelivery(t *testing.T) {
	pool := newPool(t)
	s := newStore(t, pool)
	ctx := testCtx(t, 60*time.Second)
	// Times to the nanosecond, as the Worker's are: the table keeps
	// microseconds, and an event's start and the row's, or a history
	// entry's written by a batch and one copied from the row, compare as
	// one start.
	t0 := time.Now().Add(-time.Hour).Truncate(time.Microsecond).Add(789 * time.Nanosecond)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Minute) }
	stored := func(i int) time.Time { return at(i).Truncate(time.Microsecond) }
	lost := func(id string, attempt int, start, end int, w string) []ledger.Event {
		b := ledger.Event{MessageID: id, Queue: "orders", Type: "charge"}
		run, ret := b, b
		run.Status, run.Attempt, run.At, run.StartedAt, run.Worker = ledger.StatusRunning, attempt, at(start), at(start), w
		ret.Status, ret.Attempt, ret.At, ret.StartedAt, ret.Worker = ledger.StatusRetrying, attempt, at(end), at(start), w
		ret.Error, ret.Class = sdk.ErrLeaseLost.Error(), ledger.ClassLeaseLost
		return []ledger.Event{run, ret}
	}
	// history is the job's events in order, and whether the redelivery B
	// settles (succeeded) or is still running.
	history := func(id string, settled bool) []ledger.Event {
		evs := []ledger.Event{{MessageID: id, Queue: "orders", Type: "charge", Status: ledger.StatusEnqueued, At: at(0)}}
		evs = append(evs, lost(id, 1, 1, 31, "w1")...) // attempt 1: lease lost
		// Attempt 2 (a redelivery): lease lost again; its handler, ignoring
		// its context, returns only after the next delivery has started,
		// and retried.
		evs = append(evs, lost(id, 2, 32, 70, "w2")...)
		b := ledger.Event{MessageID: id, Queue: "orders", Type: "charge", Status: ledger.StatusRunning,
			Attempt: 2, At: at(63), StartedAt: at(63), Worker: "w3"} // a classic queue: attempt 2 again
		evs = append(evs, b)
		if settled {
			b.Status, b.At, b.Duration = ledger.StatusSucceeded, at(64), time.Minute
			evs = append(evs, b)
		}
		return evs
	}
	check := func(t *testing.T, id string, settled bool, how string) {
		t.Helper()
		j, err := s.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		want := ledger.StatusRunning
		if settled {
			want = ledger.StatusSucceeded
		}
		if j.Status != want || j.Attempts != 2 || j.Worker != "w3" || !j.StartedAt.Equal(stored(63)) {
			t.Errorf("%s: row %s at attempt %d, worker %q, started %v; want %s at attempt 2, worker w3, started %v (the redelivery)",
				how, j.Status, j.Attempts, j.Worker, j.StartedAt, want, at(63))
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, settled := range []bool{false, true} {
		// In order; the lost delivery's retrying after the redelivery's
		// events (the late report); then shuffled, per event, in one
		// batch and in random splits.
		inOrder := history("job-"+suffix(), settled)
		late := history("job-"+suffix(), settled)
		late = append(late[:4], append(late[5:], late[4])...)
		for _, c := range []struct {
			how string
			evs []ledger.Event
		}{{"in order", inOrder}, {"late retrying", late}} {
			for _, e := range c.evs {
				if err := s.Write(ctx, []ledger.Event{e}); err != nil {
					t.Fatal(err)
				}
			}
			check(t, c.evs[0].MessageID, settled, c.how)
		}
		for i := range 12 {
			id := "job-" + suffix()
			evs := history(id, settled)
			rng.Shuffle(len(evs), func(a, b int) { evs[a], evs[b] = evs[b], evs[a] })
			switch i % 3 {
			case 0:
				for _, e := range evs {
					if err := s.Write(ctx, []ledger.Event{e}); err != nil {
						t.Fatal(err)
					}
				}
			case 1:
				if err := s.Write(ctx, evs); err != nil {
					t.Fatal(err)
				}
			case 2:
				for len(evs) > 0 {
					n := 1 + rng.IntN(len(evs))
					if err := s.Write(ctx, evs[:n]); err != nil {
						t.Fatal(err)
					}
					evs = evs[n:]
				}
			}
			check(t, id, settled, "shuffled")
		}
	}

	// The redelivery retries (a Retry: attempt 3 follows). Attempt 2 in
	// the history is the redelivery's retry, also when the lost delivery's
	// retrying lands after attempt 3 started (filed in the history then).
	retried := func(id string) []ledger.Event {
		evs := history(id, false)
		r := evs[len(evs)-1]
		r.Status, r.At, r.Error, r.Class, r.NextAttemptAt = ledger.StatusRetrying, at(64), "boom", sdk.ClassTransient, at(65)
		c := ledger.Event{MessageID: id, Queue: "orders", Type: "charge", Status: ledger.StatusRunning,
			Attempt: 3, At: at(65), StartedAt: at(65), Worker: "w4"}
		return append(evs, r, c)
	}
	checkRetried := func(t *testing.T, id, how string) {
		t.Helper()
		j, err := s.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.Status != ledger.StatusRunning || j.Attempts != 3 || j.Worker != "w4" {
			t.Errorf("%s: row %s at attempt %d, worker %q; want running at attempt 3, worker w4", how, j.Status, j.Attempts, j.Worker)
		}
		if len(j.History) != 3 || j.History[1].Attempt != 2 || j.History[1].Status != ledger.StatusRetrying ||
			j.History[1].Error != "boom" || j.History[1].Worker != "w3" || !j.History[1].StartedAt.Truncate(time.Microsecond).Equal(stored(63)) {
			t.Errorf("%s: history %+v; want attempt 2 retrying (boom) by w3, started %v", how, j.History, at(63))
		}
	}
	{
		evs := retried("job-" + suffix())
		late := append(append(append([]ledger.Event(nil), evs[:4]...), evs[5:]...), evs[4])
		for _, e := range late {
			if err := s.Write(ctx, []ledger.Event{e}); err != nil {
				t.Fatal(err)
			}
		}
		checkRetried(t, late[0].MessageID, "late retrying after attempt 3")
	}
	for i := range 12 {
		id := "job-" + suffix()
		evs := retried(id)
		rng.Shuffle(len(evs), func(a, b int) { evs[a], evs[b] = evs[b], evs[a] })
		if i%2 == 0 {
			for _, e := range evs {
				if err := s.Write(ctx, []ledger.Event{e}); err != nil {
					t.Fatal(err)
				}
			}
		} else if err := s.Write(ctx, evs); err != nil {
			t.Fatal(err)
		}
		checkRetried(t, id, "shuffled, retried")
	}

	// One delivery's own events still order by rank whatever their order:
	// its lost lease ends its running, also when written first.
	id := "job-" + suffix()
	evs := lost(id, 2, 1, 2, "w1")
	for _, batch := range [][]ledger.Event{{evs[1]}, {evs[0]}} {
		if err := s.Write(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	if j, err := s.Job(ctx, id); err != nil || j.Status != ledger.StatusRetrying || j.ErrorClass != ledger.ClassLeaseLost {
		t.Fatalf("one delivery's lost lease written before its start: %+v, %v; want retrying, lease_lost", j, err)
	}
}

// TestSettledCarriesItsStart: the Worker's events of one delivery carry one
// start, the one Start recorded, so that the store tells that delivery's
// events from those of another delivery of the same attempt.
func TestSettledCarriesItsStart(t *testing.T) {
	c := &capture{}
	led, err := ledger.New(ledger.Options{Store: c, Logger: quiet, Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	ctx := testCtx(t, 10*time.Second)
	settlements := []sdk.Settlement{
		{Action: sdk.ActionLeaseLost, Duration: time.Millisecond},
		{Action: sdk.ActionLeaseLost}, // a run time of zero
		{Action: sdk.ActionAck, Duration: time.Second},
		{Action: sdk.ActionRetry, Duration: 3 * time.Millisecond, Cause: errors.New("boom")},
		{Action: sdk.ActionRelease, Duration: time.Microsecond},
		{Action: sdk.ActionAck, Err: errors.New("connection lost"), Duration: time.Millisecond},
	}
	for _, s := range settlements {
		d := berthtest.NewDelivery(&sdk.Message{ID: "m-" + suffix()}, berthtest.Attempt(2))
		hctx := led.Start(ctx, d)
		led.Settled(hctx, d, s)
	}
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	starts := map[string]time.Time{}
	for _, e := range c.all() {
		if e.Status == ledger.StatusRunning {
			starts[e.MessageID] = e.StartedAt
			continue
		}
		if want, ok := starts[e.MessageID]; !ok || !e.StartedAt.Equal(want) {
			t.Errorf("%s (%s): started %v, want %v, its running's", e.Status, e.Class, e.StartedAt, want)
		}
	}
	// Without the start in ctx (a Settled called with another context),
	// the start is the run time before now, as before.
	d := berthtest.NewDelivery(&sdk.Message{ID: "m-" + suffix()}, berthtest.Attempt(2))
	led.Settled(context.Background(), d, sdk.Settlement{Action: sdk.ActionAck, Duration: time.Second})
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	all := c.all()
	if e := all[len(all)-1]; e.StartedAt.IsZero() || time.Since(e.StartedAt) < time.Second {
		t.Errorf("settled without a start in ctx: started %v, want a second before it settled", e.StartedAt)
	}
}
