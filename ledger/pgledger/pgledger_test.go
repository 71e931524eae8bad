package pgledger_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestOptionsValidated(t *testing.T) {
	for _, o := range []pgledger.Options{{Schema: "Bad"}, {Schema: "x;drop"}, {Prefix: "1x"}} {
		if _, err := pgledger.SQL(o); !errors.Is(err, pgledger.ErrInvalidOptions) {
			t.Errorf("SQL(%+v) = %v, want ErrInvalidOptions", o, err)
		}
	}
	if _, err := pgledger.New(nil, pgledger.Options{}); !errors.Is(err, pgledger.ErrInvalidOptions) {
		t.Errorf("New(nil) = %v", err)
	}
	if _, err := pgledger.NewJobs(nil, ""); !errors.Is(err, pgledger.ErrInvalidOptions) {
		t.Errorf("NewJobs(nil) = %v", err)
	}
	if _, err := pgledger.NewJobs(&pgxpool.Pool{}, "x;drop"); !errors.Is(err, pgledger.ErrInvalidOptions) || !errors.Is(err, postgres.ErrInvalidSchema) {
		t.Errorf("NewJobs(bad schema) = %v, want ErrInvalidOptions and postgres.ErrInvalidSchema", err)
	}
}

// testSchema returns a ctx bounding the test, a pool and the name of a new
// schema, dropped when the test ends.
func testSchema(t *testing.T) (context.Context, *pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	pool, err := pgxpool.New(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var p [6]byte
	_, _ = rand.Read(p[:])
	schema := "berth_pgledgertest_" + hex.EncodeToString(p[:])
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	return ctx, pool, schema
}

// jobsBroker returns a migrated PostgreSQL broker in a new schema (see
// testSchema), whose jobs table a Jobs reader reads.
func jobsBroker(t *testing.T) (context.Context, *pgxpool.Pool, *postgres.Broker, string) {
	t.Helper()
	ctx, pool, schema := testSchema(t)
	b, err := postgres.New(pool, postgres.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return ctx, pool, b, schema
}

func setup(t *testing.T) (*pgxpool.Pool, *pgledger.Store, context.Context) {
	ctx, pool, schema := testSchema(t)
	s, err := pgledger.New(pool, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	// Many processes migrating at once: the advisory lock serialises them.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- s.Migrate(ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	return pool, s, ctx
}

// TestPurgeDeletesFinishedJobsInBatches: only finished jobs older than the
// cutoff go, in bounded batches.
func TestPurgeDeletesFinishedJobsInBatches(t *testing.T) {
	_, s, ctx := setup(t)
	old, recent := time.Now().Add(-48*time.Hour), time.Now()
	var batch []ledger.Event
	add := func(id string, st ledger.Status, at time.Time) {
		batch = append(batch, ledger.Event{MessageID: id, Queue: "q", Status: ledger.StatusRunning, Attempt: 1, At: at.Add(-time.Second)},
			ledger.Event{MessageID: id, Queue: "q", Status: st, Attempt: 1, At: at, Error: "e", Class: sdk.ClassTransient})
	}
	for i := range 25 {
		add("old-done-"+strconv.Itoa(i), ledger.StatusSucceeded, old)
	}
	add("old-dead", ledger.StatusDead, old)
	add("old-retrying", ledger.StatusRetrying, old)
	add("new-done", ledger.StatusSucceeded, recent)
	if err := s.Write(ctx, batch); err != nil {
		t.Fatal(err)
	}
	n, err := s.Purge(ctx, time.Now().Add(-24*time.Hour), 10)
	if err != nil || n != 26 {
		t.Fatalf("Purge = %d, %v; want 26", n, err)
	}
	for _, id := range []string{"old-dead", "old-done-3"} {
		if _, err := s.Job(ctx, id); !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("Job(%s) after purge = %v, want ErrNotFound", id, err)
		}
	}
	for _, id := range []string{"old-retrying", "new-done"} {
		j, err := s.Job(ctx, id)
		if err != nil || len(j.History) != 1 {
			t.Errorf("Job(%s) after purge = %+v, %v; want kept with its attempt", id, j, err)
		}
	}
}

// TestPurgeStaleDeletesUnfinishedJobs: jobs that never finished and were
// last updated before the cutoff go (their message left the broker without
// berth seeing it end), in bounded batches; recent ones, those with a next
// attempt due after the cutoff, and finished ones (Purge's) stay.
func TestPurgeStaleDeletesUnfinishedJobs(t *testing.T) {
	_, s, ctx := setup(t)
	now := time.Now()
	old := now.Add(-48 * time.Hour)
	ev := func(id string, st ledger.Status, attempt int, at time.Time) ledger.Event {
		return ledger.Event{MessageID: id, Queue: "q", Status: st, Attempt: attempt, At: at}
	}
	retry := func(id string, next time.Time) ledger.Event {
		e := ev(id, ledger.StatusRetrying, 1, old)
		e.NextAttemptAt, e.Error, e.Class = next, "e", sdk.ClassTransient
		return e
	}
	batch := []ledger.Event{
		ev("old-enqueued", ledger.StatusEnqueued, 0, old),
		ev("old-running", ledger.StatusRunning, 1, old),
		ev("old-released", ledger.StatusReleased, 1, old),
		retry("old-retrying-due", old.Add(time.Hour)),
		retry("old-retrying-later", now.Add(time.Hour)), // a long backoff: still alive
		ev("old-dead", ledger.StatusDead, 1, old.Add(-time.Hour)),
		ev("old-succeeded", ledger.StatusSucceeded, 1, old),
		ev("new-running", ledger.StatusRunning, 1, now),
	}
	for i := range 5 {
		batch = append(batch, ev("old-lost-"+strconv.Itoa(i), ledger.StatusEnqueued, 0, old))
	}
	if err := s.Write(ctx, batch); err != nil {
		t.Fatal(err)
	}
	// A dead job redriven long ago whose message never came back.
	if err := s.Write(ctx, []ledger.Event{{MessageID: "old-dead", Queue: "q", Status: ledger.StatusRedriven, At: old}}); err != nil {
		t.Fatal(err)
	}
	if j, err := s.Job(ctx, "old-dead"); err != nil || j.Status != ledger.StatusRedriven {
		t.Fatalf("redriven job: %+v, %v", j, err)
	}
	n, err := s.PurgeStale(ctx, now.Add(-24*time.Hour), 2)
	if err != nil || n != 10 {
		t.Fatalf("PurgeStale = %d, %v; want 10", n, err)
	}
	for _, id := range []string{"old-enqueued", "old-running", "old-released", "old-retrying-due", "old-dead", "old-lost-4"} {
		if _, err := s.Job(ctx, id); !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("Job(%s) after PurgeStale = %v, want ErrNotFound", id, err)
		}
	}
	for _, id := range []string{"old-retrying-later", "old-succeeded", "new-running"} {
		if _, err := s.Job(ctx, id); err != nil {
			t.Errorf("Job(%s) after PurgeStale = %v, want kept", id, err)
		}
	}
	if n, err := s.PurgeStale(ctx, now.Add(-24*time.Hour), 0); err != nil || n != 0 {
		t.Errorf("second PurgeStale = %d, %v; want 0", n, err)
	}
}
