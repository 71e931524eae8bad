package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// runJanitorOnce runs the janitor with o until its first run reports, and
// returns that run.
func runJanitorOnce(t *testing.T, ctx context.Context, o ledger.JanitorOptions) ledger.JanitorRun {
	t.Helper()
	runs := make(chan ledger.JanitorRun, 1)
	o.Report = func(r ledger.JanitorRun) {
		select {
		case runs <- r:
		default:
		}
	}
	jctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ledger.RunJanitor(jctx, o) }()
	var r ledger.JanitorRun
	select {
	case r = <-runs:
	case err := <-done:
		stop()
		t.Fatalf("RunJanitor = %v before its first run", err)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunJanitor = %v, want context.Canceled", err)
	}
	return r
}

// TestJanitorPurgesJobsThatNeverFinish: a job whose message left the broker
// without berth seeing it end (purged from the queue, expired there) keeps
// its last non-final state forever; the janitor's default options delete it
// once idle for DefaultStaleRetentionFactor × Retention, and leave one idle
// for less, or with a next attempt due later.
func TestJanitorPurgesJobsThatNeverFinish(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	store := newStore(t, newPool(t))
	q := "ledger_" + suffix()
	now := time.Now()
	lost, lostRunning, recent, backoff := sdk.NewID(), sdk.NewID(), sdk.NewID(), sdk.NewID()
	longAgo := now.Add(-(ledger.DefaultStaleRetentionFactor + 1) * time.Hour)
	if err := store.Write(ctx, []ledger.Event{
		{MessageID: lost, Queue: q, Status: ledger.StatusEnqueued, At: longAgo},
		{MessageID: lostRunning, Queue: q, Status: ledger.StatusRunning, Attempt: 1, At: longAgo, StartedAt: longAgo},
		{MessageID: recent, Queue: q, Status: ledger.StatusEnqueued, At: now.Add(-2 * time.Hour)},
		{MessageID: backoff, Queue: q, Status: ledger.StatusRetrying, Attempt: 1, At: longAgo, NextAttemptAt: now.Add(time.Hour), Error: "e"},
	}); err != nil {
		t.Fatal(err)
	}
	r := runJanitorOnce(t, ctx, ledger.JanitorOptions{Purger: store, Retention: time.Hour, Interval: time.Hour})
	if r.Err != nil {
		t.Fatalf("janitor run: %+v", r)
	}
	for _, id := range []string{lost, lostRunning} {
		if _, err := store.Job(ctx, id); !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("job idle since %s that never finished: Job = %v, want ErrNotFound (purged)", longAgo.Format(time.TimeOnly), err)
		}
	}
	for _, id := range []string{recent, backoff} {
		if _, err := store.Job(ctx, id); err != nil {
			t.Errorf("Job(%s) = %v, want kept", id, err)
		}
	}
}

// TestJanitorStaleRetention: the run counts what it deleted as stale, a
// negative StaleRetention keeps such jobs, and a bad one is refused.
func TestJanitorStaleRetention(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	store := newStore(t, newPool(t))
	q := "ledger_" + suffix()
	id := sdk.NewID()
	if err := store.Write(ctx, []ledger.Event{{MessageID: id, Queue: q, Status: ledger.StatusRunning, Attempt: 1, At: time.Now().Add(-3 * time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	if r := runJanitorOnce(t, ctx, ledger.JanitorOptions{Purger: store, Retention: time.Hour, StaleRetention: -1, Interval: time.Hour}); r.Err != nil || r.Stale != 0 {
		t.Fatalf("run with StaleRetention -1: %+v; want nothing stale purged", r)
	}
	if _, err := store.Job(ctx, id); err != nil {
		t.Fatalf("Job with StaleRetention -1 = %v, want kept", err)
	}
	if r := runJanitorOnce(t, ctx, ledger.JanitorOptions{Purger: store, Retention: time.Hour, StaleRetention: 2 * time.Hour, Interval: time.Hour}); r.Err != nil || r.Stale != 1 || r.Purged != 0 {
		t.Fatalf("run with StaleRetention 2h: %+v; want 1 stale purged", r)
	}
	if _, err := store.Job(ctx, id); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Job after the stale purge = %v, want ErrNotFound", err)
	}
	for _, o := range []ledger.JanitorOptions{
		{Purger: store, Retention: time.Hour, StaleRetention: time.Minute}, // shorter than Retention
		{Purger: nopPurger{}, StaleRetention: 30 * 24 * time.Hour},         // cannot purge stale jobs
	} {
		if err := ledger.RunJanitor(ctx, o); !errors.Is(err, ledger.ErrInvalidJanitor) {
			t.Errorf("RunJanitor(StaleRetention %s, %T) = %v, want ErrInvalidJanitor", o.StaleRetention, o.Purger, err)
		}
	}
	// The default with a Purger that cannot purge stale jobs does nothing.
	if r := runJanitorOnce(t, ctx, ledger.JanitorOptions{Purger: nopPurger{}, Interval: time.Hour}); r.Err != nil || r.Stale != 0 {
		t.Errorf("default with a plain Purger: %+v", r)
	}
}

// TestDelayedJobOutlivesStaleRetention: a job published with a delay is
// alive until it is due, however long it has gone without an event. The
// enqueued event records when it is due (its Delay; LongDelay's due
// header), and the stale purge keys on that. Before, the enqueued event
// carried no due time: a job delayed longer than StaleRetention lost its
// row to the purge while its message still waited in the broker.
func TestDelayedJobOutlivesStaleRetention(t *testing.T) {
	e := memoryEnv(t)
	ctx := testCtx(t, 30*time.Second)
	store := e.reader.(interface {
		ledger.Reader
		ledger.StalePurger
	})
	pub := e.led.Publisher(e.b)
	before := time.Now()
	delayed := &sdk.Message{Type: "t", Delay: time.Hour}
	undelayed := &sdk.Message{Type: "t"}
	if err := pub.Publish(ctx, e.queue, delayed, undelayed); err != nil {
		t.Fatal(err)
	}
	// LongDelay outside the ledger's publisher: the message it publishes
	// carries the due time in its header, its Delay only the first hop.
	long := &sdk.Message{Type: "t", Delay: 40 * 24 * time.Hour}
	if err := (sdk.LongDelay{Publisher: pub, Limit: time.Hour}).Publish(ctx, e.queue, long); err != nil {
		t.Fatal(err)
	}
	// And inside it: the message the ledger sees after publishing is
	// LongDelay's.
	inner := &sdk.Message{Type: "t", Delay: 40 * 24 * time.Hour}
	if err := e.led.Publisher(sdk.LongDelay{Publisher: e.b, Limit: time.Hour}).Publish(ctx, e.queue, inner); err != nil {
		t.Fatal(err)
	}
	if err := e.led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	for _, c := range []struct {
		id    string
		delay time.Duration
	}{{delayed.ID, time.Hour}, {long.ID, 40 * 24 * time.Hour}, {inner.ID, 40 * 24 * time.Hour}} {
		j, err := store.Job(ctx, c.id)
		if err != nil {
			t.Fatal(err)
		}
		lo, hi := before.Add(c.delay).Add(-time.Millisecond), after.Add(c.delay).Add(time.Millisecond)
		if j.Status != ledger.StatusEnqueued || j.NextAttemptAt.Before(lo) || j.NextAttemptAt.After(hi) {
			t.Errorf("job delayed %s: %s, due %s; want enqueued, due in [%s, %s]", c.delay, j.Status, j.NextAttemptAt, lo, hi)
		}
	}
	if j, err := store.Job(ctx, undelayed.ID); err != nil || !j.NextAttemptAt.IsZero() {
		t.Errorf("job without a delay: %+v, %v; want no due time", j, err)
	}
	// Every row is idle since before the cutoff; only the job due is stale.
	n, err := store.PurgeStale(ctx, after.Add(time.Minute), 0)
	if err != nil || n != 1 {
		t.Errorf("PurgeStale = %d, %v; want 1 (the job without a delay)", n, err)
	}
	for _, id := range []string{delayed.ID, long.ID, inner.ID} {
		if _, err := store.Job(ctx, id); err != nil {
			t.Errorf("delayed job %s after the stale purge: %v, want kept", id, err)
		}
	}
}
