package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// TestLedger runs the ledger scenario on every broker: on memory, RabbitMQ
// and SQS the ledger is fed by its Publisher, Observer and DeadLetters
// wrappers into pgledger.Store; on PostgreSQL pgledger.Jobs reads the
// broker's jobs table and nothing feeds a ledger.
func TestLedger(t *testing.T) {
	for _, c := range []struct {
		name string
		env  func(*testing.T) env
	}{
		{"memory", memoryEnv},
		{"rabbitmq", func(t *testing.T) env { return rabbitEnv(t) }},
		{"sqs", sqsEnv},
		{"postgres", postgresEnv},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			scenario(t, c.env(t))
		})
	}
}

// running is a Worker running until stop.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

func startWorker(t testing.TB, e env, h sdk.Handler, opts sdk.WorkerOptions) *running {
	t.Helper()
	opts.Queue = e.queue
	opts.Observers = append(opts.Observers, e.observers()...)
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	w, err := sdk.NewWorker(e.b, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *running) stop(t testing.TB) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	if err := <-r.done; err != nil {
		t.Errorf("Worker.Run: %v", err)
	}
}

// waitJob polls r until the job with id satisfies ok, and returns it.
func waitJob(t *testing.T, ctx context.Context, r ledger.Reader, id, what string, ok func(*ledger.Job) bool) *ledger.Job {
	t.Helper()
	var last *ledger.Job
	for {
		j, err := r.Job(ctx, id)
		switch {
		case err == nil:
			last = j
			if ok(j) {
				return j
			}
		case !errors.Is(err, sdk.ErrNotFound):
			t.Fatalf("Job(%s): %v", id, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job %s never %s; last seen: %+v", id, what, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

var errFlaky = errors.New("flaky: try again")

func scenario(t *testing.T, e env) {
	ctx := testCtx(t, 90*time.Second)
	flaky := &sdk.Message{Type: "ledger.flaky", IdempotencyKey: "flaky:" + suffix(), Body: []byte(`{}`)}
	perm := &sdk.Message{Type: "ledger.perm", IdempotencyKey: "perm:" + suffix(), Body: []byte(`{}`)}
	var redriven atomic.Bool
	var mu sync.Mutex
	calls := map[string]int{}
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		m := d.Message()
		mu.Lock()
		calls[m.Type]++
		n := calls[m.Type]
		mu.Unlock()
		switch {
		case m.Type == "ledger.flaky" && n <= 2:
			return fmt.Errorf("attempt %d: %w", d.Attempt(), errFlaky)
		case m.Type == "ledger.perm" && !redriven.Load():
			return sdk.Permanent(errors.New("card declined"))
		}
		return nil
	})
	opts := sdk.WorkerOptions{Concurrency: 2, Retry: sdk.RetryPolicy{MaxAttempts: 5,
		Backoff: sdk.Backoff{Base: time.Second, Max: time.Second, Jitter: -1}}}
	w := startWorker(t, e, h, opts)
	if err := e.publisher().Publish(ctx, e.queue, flaky, perm); err != nil {
		t.Fatal(err)
	}

	// Fails twice, then succeeds: retrying with the next attempt's time and
	// the last error, then succeeded at attempt 3.
	j := waitJob(t, ctx, e.reader, flaky.ID, "retrying", func(j *ledger.Job) bool { return j.Status == ledger.StatusRetrying })
	if j.NextAttemptAt.IsZero() || !strings.Contains(j.LastError, errFlaky.Error()) {
		t.Errorf("retrying job: next attempt %v, last error %q; want a time and %q", j.NextAttemptAt, j.LastError, errFlaky)
	}
	if j.Queue != e.queue || j.Type != flaky.Type || j.IdempotencyKey != flaky.IdempotencyKey || j.CorrelationID != flaky.CorrelationID {
		t.Errorf("retrying job: queue %q type %q key %q correlation %q; want %q %q %q %q",
			j.Queue, j.Type, j.IdempotencyKey, j.CorrelationID, e.queue, flaky.Type, flaky.IdempotencyKey, flaky.CorrelationID)
	}
	j = waitJob(t, ctx, e.reader, flaky.ID, "succeeded", func(j *ledger.Job) bool { return j.Status == ledger.StatusSucceeded })
	if j.Attempts != 3 {
		t.Errorf("succeeded job: attempts %d, want 3", j.Attempts)
	}
	if e.led != nil {
		// The ledger's own store keeps every attempt.
		var got []string
		for _, a := range j.History {
			got = append(got, fmt.Sprintf("%d:%s", a.Attempt, a.Status))
		}
		if want := "1:retrying 2:retrying 3:succeeded"; strings.Join(got, " ") != want {
			t.Errorf("history %q, want %q", strings.Join(got, " "), want)
		}
		if j.Worker != e.led.WorkerID() || j.Duration <= 0 || j.StartedAt.IsZero() || j.FinishedAt.Before(j.StartedAt) {
			t.Errorf("succeeded job: worker %q duration %v started %v finished %v", j.Worker, j.Duration, j.StartedAt, j.FinishedAt)
		}
	}
	byKey, err := e.reader.JobByKey(ctx, flaky.IdempotencyKey)
	if err != nil || byKey.MessageID != flaky.ID {
		t.Errorf("JobByKey(%s) = %+v, %v; want message %s", flaky.IdempotencyKey, byKey, err, flaky.ID)
	}

	// A permanent failure: dead, with the reason and its class.
	j = waitJob(t, ctx, e.reader, perm.ID, "dead", func(j *ledger.Job) bool { return j.Status == ledger.StatusDead })
	if !strings.Contains(j.LastError, "card declined") || j.ErrorClass != sdk.ClassPermanent || j.Attempts != 1 {
		t.Errorf("dead job: error %q class %q attempts %d; want card declined, %s, 1", j.LastError, j.ErrorClass, j.Attempts, sdk.ClassPermanent)
	}
	c, err := e.reader.Counts(ctx, ledger.Window{Queue: e.queue, Since: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if c.ByStatus[ledger.StatusSucceeded] != 1 || c.ByStatus[ledger.StatusDead] != 1 || c.ByClass[sdk.ClassPermanent] != 1 {
		t.Errorf("counts %+v, want 1 succeeded, 1 dead, 1 permanent", c)
	}
	page, err := e.reader.List(ctx, ledger.Filter{Queue: e.queue, Statuses: []ledger.Status{ledger.StatusDead}})
	if err != nil || len(page.Jobs) != 1 || page.Jobs[0].MessageID != perm.ID {
		t.Errorf("List(dead) = %+v, %v; want %s alone", page, err, perm.ID)
	}

	// Redriven with no worker running: redriven; then its new outcome.
	w.stop(t)
	waitDeadLetter(t, ctx, e.b, e.queue, perm.ID)
	redriven.Store(true)
	if n, err := e.deadLetters().RedriveDeadLetters(ctx, e.queue, perm.ID); err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters = %d, %v; want 1", n, err)
	}
	j = waitJob(t, ctx, e.reader, perm.ID, "redriven", func(j *ledger.Job) bool { return j.Status == ledger.StatusRedriven })
	if j.Generation != 1 || j.Attempts != 0 {
		t.Errorf("redriven job: generation %d attempts %d, want 1 and 0", j.Generation, j.Attempts)
	}
	startWorker(t, e, h, opts)
	j = waitJob(t, ctx, e.reader, perm.ID, "succeeded after the redrive", func(j *ledger.Job) bool { return j.Status == ledger.StatusSucceeded })
	// Attempt 1 of the new generation, except on SQS when the stopped
	// Worker's cancelled long poll still received the message on the
	// server: it comes back after its visibility timeout at attempt 2 (no
	// Worker saw attempt 1, so the ledger has no row for it).
	if j.Generation != 1 || j.Attempts < 1 || j.Attempts > 1 && e.name != "sqs" {
		t.Errorf("redriven job done: generation %d attempts %d, want 1 and 1", j.Generation, j.Attempts)
	}
	if e.led != nil {
		var got []string
		for _, a := range j.History {
			got = append(got, fmt.Sprintf("%d.%d:%s", a.Generation, a.Attempt, a.Status))
		}
		if want := fmt.Sprintf("0.1:dead 1.%d:succeeded", j.Attempts); strings.Join(got, " ") != want {
			t.Errorf("history %q, want %q", strings.Join(got, " "), want)
		}
		if s := e.led.Stats(); s.Dropped != 0 || s.Failed != 0 {
			t.Errorf("ledger stats %+v: nothing should be dropped or failed", s)
		}
	}
}

// waitDeadLetter waits until the broker lists id as a dead letter of q.
func waitDeadLetter(t *testing.T, ctx context.Context, dl sdk.DeadLetters, q, id string) {
	t.Helper()
	for {
		_, err := dl.GetDeadLetter(ctx, q, id)
		if err == nil {
			return
		}
		if !errors.Is(err, sdk.ErrNotFound) {
			t.Fatalf("GetDeadLetter(%s): %v", id, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never reached the dead-letter queue", id)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestRedriveWholeQueue: a redrive of a whole queue (no IDs) through
// Ledger.DeadLetters moves the dead jobs of the queue; the ledger shows
// each in its new generation once it starts again (it cannot know which
// jobs moved: see TestRedriveWholeQueueSkipsPurged), and the others are
// untouched.
func TestRedriveWholeQueue(t *testing.T) {
	e := memoryEnv(t)
	ctx := testCtx(t, 60*time.Second)
	bad := []*sdk.Message{{Type: "bad"}, {Type: "bad"}}
	good := &sdk.Message{Type: "good"}
	if err := e.publisher().Publish(ctx, e.queue, append(bad, good)...); err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, e, sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		if d.Message().Type == "bad" {
			return sdk.Permanent(errors.New("no"))
		}
		return nil
	}), sdk.WorkerOptions{})
	for _, m := range bad {
		waitJob(t, ctx, e.reader, m.ID, "dead", func(j *ledger.Job) bool { return j.Status == ledger.StatusDead })
	}
	waitJob(t, ctx, e.reader, good.ID, "succeeded", func(j *ledger.Job) bool { return j.Status == ledger.StatusSucceeded })
	w.stop(t)
	if n, err := e.deadLetters().RedriveDeadLetters(ctx, e.queue); err != nil || n != 2 {
		t.Fatalf("RedriveDeadLetters(all) = %d, %v; want 2", n, err)
	}
	w = startWorker(t, e, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{})
	for _, m := range bad {
		j := waitJob(t, ctx, e.reader, m.ID, "succeeded in generation 1", func(j *ledger.Job) bool {
			return j.Status == ledger.StatusSucceeded && j.Generation == 1
		})
		if len(j.History) == 0 || j.History[0].Generation != 0 || j.History[0].Status != ledger.StatusDead {
			t.Errorf("redriven job %+v: want the dead attempt in its history", j)
		}
	}
	w.stop(t)
	if j, err := e.reader.Job(ctx, good.ID); err != nil || j.Status != ledger.StatusSucceeded {
		t.Errorf("the succeeded job after a whole-queue redrive: %+v, %v", j, err)
	}
}

// TestOutboxRelayRecordsEnqueued: the outbox relay, given the ledger's
// Publisher, records each relayed job as enqueued, with the message
// fields the application gave at Add.
func TestOutboxRelayRecordsEnqueued(t *testing.T) {
	e := memoryEnv(t)
	ctx := testCtx(t, 60*time.Second)
	pool := newPool(t)
	box, err := outbox.New(pool, outbox.Options{Schema: freshSchema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	m := &sdk.Message{Type: "order.placed", IdempotencyKey: "order:9", Body: []byte(`{}`)}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Add(ctx, tx, e.queue, m); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := box.RelayOnce(ctx, e.publisher(), outbox.RelayOptions{}); err != nil || n != 1 {
		t.Fatalf("RelayOnce = %d, %v", n, err)
	}
	j := waitJob(t, ctx, e.reader, m.ID, "enqueued", func(j *ledger.Job) bool { return j.Status == ledger.StatusEnqueued })
	if j.Queue != e.queue || j.Type != m.Type || j.IdempotencyKey != "order:9" {
		t.Errorf("relayed job %+v", j)
	}
}
