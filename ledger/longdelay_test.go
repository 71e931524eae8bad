package ledger_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// A job delayed by sdk.LongDelay is one job in the ledger, whatever the
// number of hops: while it hops it is enqueued, due at its due time (not
// succeeded, and no hop is a job of its own), and it succeeds only once its
// handler ran, at the due time. The hops go through the ledger's publisher
// (inside), or only the first publish does (outside).
func TestLongDelayHopsAreOneJob(t *testing.T) {
	for _, inside := range []bool{true, false} {
		name := map[bool]string{true: "inside", false: "outside"}[inside]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			longDelayOneJob(t, inside)
		})
	}
}

func longDelayOneJob(t *testing.T, inside bool) {
	e := memoryEnv(t)
	ctx := testCtx(t, 30*time.Second)
	const limit, delay = time.Second, 2500 * time.Millisecond
	ld := sdk.LongDelay{Publisher: e.publisher(), Limit: limit}
	var pub sdk.Publisher = ld
	if !inside {
		ld.Publisher = e.b
		pub = e.led.Publisher(ld)
	}

	var mu sync.Mutex
	var ran []time.Time
	var hops int
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
		mu.Lock()
		ran = append(ran, time.Now())
		mu.Unlock()
		return nil
	})
	count := func(next sdk.Handler) sdk.Handler {
		return sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
			if v := d.Message().Header(sdk.HeaderDueAt); v != "" {
				if due, err := time.Parse(time.RFC3339Nano, v); err == nil && time.Now().Before(due) {
					mu.Lock()
					hops++
					mu.Unlock()
				}
			}
			return next.Handle(ctx, d)
		})
	}
	startWorker(t, e, h, sdk.WorkerOptions{Middleware: []sdk.Middleware{count, ld.Middleware()}})

	m := &sdk.Message{Type: "ledger.longdelay", Body: []byte(`{}`), Delay: delay}
	if err := pub.Publish(ctx, e.queue, m); err != nil {
		t.Fatalf("LongDelay.Publish: %v", err)
	}
	due, err := time.Parse(time.RFC3339Nano, m.Header(sdk.HeaderDueAt))
	if err != nil {
		t.Fatalf("due header %q: %v", m.Header(sdk.HeaderDueAt), err)
	}

	// After the first hop (at ~Limit), well before the due time.
	time.Sleep(limit + 500*time.Millisecond)
	if err := e.led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	h1, r1 := hops, len(ran)
	mu.Unlock()
	if h1 == 0 || r1 != 0 || !time.Now().Before(due) {
		t.Fatalf("before the due time: %d hops, %d runs (want some hops, no run; the test ran late?)", h1, r1)
	}
	j, err := e.reader.Job(ctx, m.ID)
	if err != nil {
		t.Fatalf("Job(%s) while hopping: %v", m.ID, err)
	}
	if j.Status != ledger.StatusEnqueued || !j.NextAttemptAt.Equal(due.Truncate(time.Microsecond)) {
		t.Errorf("while hopping: status %s, next attempt %s; want enqueued, due %s", j.Status, j.NextAttemptAt, due)
	}
	oneJob(t, ctx, e, "while hopping")

	// Once it ran.
	j = waitJob(t, ctx, e.reader, m.ID, "succeeded", func(j *ledger.Job) bool { return j.Status == ledger.StatusSucceeded })
	mu.Lock()
	if len(ran) != 1 || ran[0].Before(due) {
		t.Errorf("handler ran at %v, want once, not before %s", ran, due)
	}
	mu.Unlock()
	if j.Attempts != 1 || j.StartedAt.Before(due.Truncate(time.Microsecond)) || !j.NextAttemptAt.IsZero() || j.MessageID != m.ID {
		t.Errorf("after the run: %+v; want attempt 1 started at or after %s, no next attempt", j, due)
	}
	for _, a := range j.History {
		if a.StartedAt.Before(due.Truncate(time.Microsecond)) {
			t.Errorf("history records an attempt before the due time: %+v", a)
		}
	}
	oneJob(t, ctx, e, "after the run")
	mu.Lock()
	if hops < 2 {
		t.Errorf("%d hops, want 2", hops)
	}
	mu.Unlock()
}

// oneJob checks that the ledger of e holds one job in its queue, when.
func oneJob(t *testing.T, ctx context.Context, e env, when string) {
	t.Helper()
	page, err := e.reader.List(ctx, ledger.Filter{Queue: e.queue})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Jobs) != 1 {
		for _, j := range page.Jobs {
			t.Logf("row %s: %s attempts %d next %s", j.MessageID, j.Status, j.Attempts, j.NextAttemptAt)
		}
		t.Errorf("%s: %d jobs in the ledger, want 1", when, len(page.Jobs))
	}
}

// TestLongDelayDueWhileStarting: the due time of a delivery passes between
// the ledger's Start (which takes it for a hop and records no running) and
// the middleware's own reading (which runs the handler). The ledger took
// the ack for a hop by comparing the due time with its own start, and
// recorded the job enqueued, due in the past: its success was never
// recorded. The middleware now says whether it hopped (sdk.WithHopNotice):
// a run is a run. The middleware's clock, an hour ahead, stands for the
// reading taken after the due time passed.
func TestLongDelayDueWhileStarting(t *testing.T) {
	e := memoryEnv(t)
	ctx := testCtx(t, 30*time.Second)
	ld := sdk.LongDelay{Publisher: e.publisher(), Limit: time.Second, Now: func() time.Time { return time.Now().Add(time.Hour) }}
	ran := make(chan struct{}, 1)
	startWorker(t, e, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
		ran <- struct{}{}
		return nil
	}), sdk.WorkerOptions{Middleware: []sdk.Middleware{ld.Middleware()}})

	m := &sdk.Message{Type: "ledger.longdelay", Body: []byte(`{}`)}
	m.SetHeader(sdk.HeaderDueAt, time.Now().Add(30*time.Minute).UTC().Format(time.RFC3339Nano))
	if err := e.publisher().Publish(ctx, e.queue, m); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-ctx.Done():
		t.Fatal("the handler did not run")
	}
	j := waitJob(t, ctx, e.reader, m.ID, "succeeded", func(j *ledger.Job) bool { return j.Status != ledger.StatusEnqueued })
	if j.Status != ledger.StatusSucceeded || j.Attempts != 1 || j.StartedAt.IsZero() {
		t.Errorf("a job whose handler ran: %s, attempt %d, started %s; want succeeded at attempt 1 with its start", j.Status, j.Attempts, j.StartedAt)
	}
}
