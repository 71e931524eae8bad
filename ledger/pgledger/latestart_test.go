package pgledger_test

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// attemptEvents is one job's three attempts as the feeds write them: each
// attempt's running event carries its start and worker, its settlement
// (retrying twice, then succeeded) carries neither start nor run time, as
// a settlement with a run time of zero or a dead letter found by a sync.
func attemptEvents(id string, t0 time.Time) []ledger.Event {
	var evs []ledger.Event
	for a := 1; a <= 3; a++ {
		start := t0.Add(time.Duration(a) * time.Minute)
		w := "w" + strconv.Itoa(a)
		evs = append(evs, ledger.Event{MessageID: id, Queue: "q", Status: ledger.StatusRunning, Attempt: a, At: start, StartedAt: start, Worker: w})
		end := ledger.Event{MessageID: id, Queue: "q", Status: ledger.StatusRetrying, Attempt: a, At: start.Add(time.Second),
			Error: "boom", Class: sdk.ClassTransient, NextAttemptAt: start.Add(time.Minute)}
		if a == 3 {
			end.Status, end.Error, end.Class, end.NextAttemptAt = ledger.StatusSucceeded, "", "", time.Time{}
		}
		evs = append(evs, end)
	}
	return evs
}

// checkStarts checks that job id ended as attemptEvents ends, every
// attempt with the start and worker its running event said.
func checkStarts(t *testing.T, j *ledger.Job, t0 time.Time) {
	t.Helper()
	start := func(a int) time.Time { return t0.Add(time.Duration(a) * time.Minute) }
	if j.Status != ledger.StatusSucceeded || j.Attempts != 3 || !j.StartedAt.Equal(start(3)) || j.Worker != "w3" {
		t.Errorf("%s: status %s attempt %d started %v worker %q, want succeeded 3 %v w3", j.MessageID, j.Status, j.Attempts, j.StartedAt, j.Worker, start(3))
	}
	if len(j.History) != 3 {
		t.Fatalf("%s: history %+v, want 3 attempts", j.MessageID, j.History)
	}
	for i, a := range j.History {
		if a.Attempt != i+1 || !a.StartedAt.Equal(start(i+1)) || a.Worker != "w"+strconv.Itoa(i+1) {
			t.Errorf("%s: attempt %d started %v worker %q, want attempt %d %v w%d", j.MessageID, a.Attempt, a.StartedAt, a.Worker, i+1, start(i+1), i+1)
		}
	}
}

// TestLateStartKept: an attempt's running event written after its
// settlement fills in the start and worker the settlement did not say —
// on the row, in the history, and within one batch — and a later attempt
// that does not say its start does not borrow an earlier attempt's.
func TestLateStartKept(t *testing.T) {
	_, s, ctx := setup(t)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	// Every settlement before every running event, one event per write:
	// the upsert's path.
	sep := "sep"
	evs := attemptEvents(sep, t0)
	for _, i := range []int{1, 3, 5, 0, 2, 4} {
		if err := s.Write(ctx, []ledger.Event{evs[i]}); err != nil {
			t.Fatal(err)
		}
	}
	// The same order in one batch: the in-batch merge and history.
	one := "one"
	evs = attemptEvents(one, t0)
	if err := s.Write(ctx, []ledger.Event{evs[1], evs[3], evs[5], evs[0], evs[2], evs[4]}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{sep, one} {
		j, err := s.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		checkStarts(t, j, t0)
	}
	// Attempt 2's dead letter, start unknown, after attempt 1's run.
	dead := "dead"
	evs = attemptEvents(dead, t0)
	if err := s.Write(ctx, evs[:2]); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, []ledger.Event{{MessageID: dead, Queue: "q", Status: ledger.StatusDead, Attempt: 2, At: t0.Add(3 * time.Minute), Error: "limit"}}); err != nil {
		t.Fatal(err)
	}
	j, err := s.Job(ctx, dead)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != ledger.StatusDead || !j.StartedAt.IsZero() || j.Worker != "" {
		t.Errorf("dead attempt 2: status %s started %v worker %q, want dead, start and worker unknown", j.Status, j.StartedAt, j.Worker)
	}
}

// TestConcurrentWritersKeepStarts: four writers write 40 jobs' events in
// random order and random batches, every event twice; every job ends with
// its last attempt and every attempt keeps its start and worker. Before
// the start was merged whatever the order, every run lost some.
func TestConcurrentWritersKeepStarts(t *testing.T) {
	_, s, ctx := setup(t)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	var ids []string
	var all []ledger.Event
	for i := range 40 {
		id := "job-" + strconv.Itoa(i)
		ids = append(ids, id)
		evs := attemptEvents(id, t0)
		all = append(all, evs...)
		all = append(all, evs...)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	rng.Shuffle(len(all), func(a, b int) { all[a], all[b] = all[b], all[a] })
	const writers = 4
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		var mine []ledger.Event
		for i := w; i < len(all); i += writers {
			mine = append(mine, all[i])
		}
		sizes := rand.New(rand.NewPCG(uint64(w), 3))
		wg.Go(func() {
			for len(mine) > 0 {
				n := min(1+sizes.IntN(6), len(mine))
				if err := s.Write(ctx, mine[:n]); err != nil {
					errs <- err
					return
				}
				mine = mine[n:]
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, id := range ids {
		j, err := s.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		checkStarts(t, j, t0)
	}
}
