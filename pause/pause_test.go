package pause_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/pause"
	"github.com/berthq/berth/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newStore(t *testing.T) (*pause.PG, *pgxpool.Pool, string) {
	t.Helper()
	pool, schema := pgtest.Schema(t, 0)
	s, err := pause.NewPG(pool, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil { // idempotent
		t.Fatal(err)
	}
	return s, pool, schema
}

func TestPGStore(t *testing.T) {
	s, _, _ := newStore(t)
	ctx := context.Background()
	if changed, err := s.Pause(ctx, "emails"); err != nil || !changed {
		t.Fatalf("Pause: %v %v", changed, err)
	}
	if changed, err := s.Pause(ctx, "emails"); err != nil || changed {
		t.Fatalf("Pause again: %v %v", changed, err)
	}
	if _, err := s.Pause(ctx, "bad queue"); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("Pause(bad queue) = %v", err)
	}
	ps, err := s.Paused(ctx)
	if err != nil || len(ps) != 1 || ps[0].Queue != "emails" || ps[0].Since.IsZero() {
		t.Fatalf("Paused = %+v, %v", ps, err)
	}
	if changed, err := s.Resume(ctx, "emails"); err != nil || !changed {
		t.Fatalf("Resume: %v %v", changed, err)
	}
	if changed, err := s.Resume(ctx, "emails"); err != nil || changed {
		t.Fatalf("Resume again: %v %v", changed, err)
	}
	if ps, err := s.Paused(ctx); err != nil || len(ps) != 0 {
		t.Fatalf("Paused after resume = %+v, %v", ps, err)
	}
	if _, err := pause.NewPG(nil, pause.PGOptions{}); err == nil {
		t.Error("NewPG(nil) succeeded")
	}
}

func TestInvalidSchema(t *testing.T) {
	_, pool, _ := newStore(t)
	if _, err := pause.NewPG(pool, pause.PGOptions{Schema: `x"; DROP TABLE y; --`}); !errors.Is(err, pause.ErrInvalidSchema) {
		t.Errorf("NewPG = %v, want ErrInvalidSchema", err)
	}
}

// A pause recorded in the table stops a synced Worker receiving from that
// queue (the other keeps flowing); removing it resumes the queue.
func TestSyncPausesAndResumesWorkers(t *testing.T) {
	s, _, _ := newStore(t)
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var mu sync.Mutex
	handled := map[string]int{}
	h := sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		mu.Lock()
		handled[d.Queue()]++
		mu.Unlock()
		return nil
	})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Logger: quiet, Queues: []sdk.WorkerQueue{{Name: "reports"}, {Name: "emails"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pause(ctx, "emails"); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := pause.Sync(rctx, w, s, pause.SyncOptions{Interval: 20 * time.Millisecond, Logger: quiet}); err != nil {
			t.Errorf("Sync: %v", err)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !w.Paused("emails") { // the first sync runs at once
		if time.Now().After(deadline) {
			t.Fatal("emails not paused by Sync")
		}
		time.Sleep(5 * time.Millisecond)
	}
	go func() {
		defer wg.Done()
		if err := w.Run(rctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	defer func() { cancel(); wg.Wait() }()

	for _, q := range []string{"reports", "emails"} {
		for range 5 {
			if err := b.Publish(ctx, q, &sdk.Message{Type: "t"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitHandled := func(q string, n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			got := handled[q]
			mu.Unlock()
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d %s jobs handled", got, n, q)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitHandled("reports", 5)
	time.Sleep(100 * time.Millisecond) // several syncs: emails must stay paused
	mu.Lock()
	if handled["emails"] != 0 {
		t.Errorf("%d emails handled while paused", handled["emails"])
	}
	mu.Unlock()
	if st, err := b.Stats(ctx, "emails"); err != nil || st.Ready != 5 {
		t.Errorf("emails stats %+v, %v; want 5 ready", st, err)
	}
	if _, err := s.Resume(ctx, "emails"); err != nil {
		t.Fatal(err)
	}
	waitHandled("emails", 5)

	// A queue paused in-process only is resumed by the next sync: Sync owns
	// the state.
	if err := w.Pause("reports"); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for w.Paused("reports") {
		if time.Now().After(deadline) {
			t.Fatal("Sync did not resume reports")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A Lister that fails keeps the state last applied.
func TestSyncKeepsStateWhenTheStoreFails(t *testing.T) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Pause("q"); err != nil {
		t.Fatal(err)
	}
	l := &failing{calls: make(chan struct{}, 10)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- pause.Sync(ctx, w, l, pause.SyncOptions{Interval: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	for range 3 {
		<-l.calls
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !w.Paused("q") {
		t.Error("a failed read resumed the queue")
	}
}

type failing struct{ calls chan struct{} }

func (f *failing) Paused(context.Context) ([]pause.Paused, error) {
	select {
	case f.calls <- struct{}{}:
	default:
	}
	return nil, errors.New("database down")
}

// Every process of a deployment may run Migrate as it starts: runs at the
// same moment must all succeed. PostgreSQL's CREATE SCHEMA/TABLE IF NOT
// EXISTS fail with a unique violation (pg_namespace, pg_type) when another
// session creates the object meanwhile, so unserialised runs failed.
func TestMigrateConcurrently(t *testing.T) {
	pool, schema := pgtest.Schema(t, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for round := range 5 {
		// A schema that does not exist yet, as in a new deployment.
		fresh := schema + "_" + pgtest.Suffix()
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+fresh+` CASCADE`) })
		s, err := pause.NewPG(pool, pause.PGOptions{Schema: fresh})
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 8)
		var wg sync.WaitGroup
		for range cap(errs) {
			wg.Go(func() { errs <- s.Migrate(ctx) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: concurrent Migrate: %v", round, err)
			}
		}
		if _, err := s.Pause(ctx, "emails"); err != nil {
			t.Fatalf("round %d: Pause after Migrate: %v", round, err)
		}
	}
}

// A row whose paused_at is not a finite time (an operator's hand-written
// 'infinity', meaning "for good") is still a pause. Scanning it into a
// time.Time failed the whole read, so every Sync kept its last state for
// ever (no queue paused or resumed any more) and a Worker starting held
// all its queues.
func TestPausedListsRowsWithInfiniteTime(t *testing.T) {
	s, pool, schema := newStore(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.paused_queues VALUES ('emails', 'infinity'), ('old', '-infinity')`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pause(ctx, "reports"); err != nil {
		t.Fatal(err)
	}
	ps, err := s.Paused(ctx)
	if err != nil {
		t.Fatalf("Paused: %v", err)
	}
	if len(ps) != 3 || ps[0].Queue != "emails" || !ps[0].Since.IsZero() || ps[1].Queue != "old" || ps[2].Queue != "reports" || ps[2].Since.IsZero() {
		t.Fatalf("Paused = %+v; want emails and old (zero Since), reports", ps)
	}
}
