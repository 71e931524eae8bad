package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/idempotency/storetest"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" { // re-executed by a crash test
		helperProcess(role)
	}
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	e := newEnv(t) // one schema for the suite: keys are unique per case
	storetest.Run(t, func(t *testing.T) idempotency.Store { return e.store })
}

func TestIdentifiersValidated(t *testing.T) {
	for _, o := range []pgstore.Options{
		{Schema: `x"; DROP TABLE users; --`},
		{Table: "Job-Results"},
		{Table: "1abc"},
		{Schema: strings.Repeat("a", 41)},
	} {
		if _, err := pgstore.New(&pgxpool.Pool{}, o); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", o, err)
		}
		if _, err := pgstore.SQL(o); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("SQL(%+v) = %v, want ErrInvalidConfig", o, err)
		}
	}
}

func TestSchemaFileMatchesSQL(t *testing.T) {
	b, err := os.ReadFile("schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	want, err := pgstore.SQL(pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(b), want) {
		t.Fatalf("schema.sql is out of date with pgstore.SQL; regenerate it")
	}
}

func TestMigrateTwice(t *testing.T) {
	e := newEnv(t)
	if err := e.store.Migrate(context.Background()); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
}

func chargeMsg(key, body string) *sdk.Message {
	return &sdk.Message{ID: sdk.NewID(), Type: "billing.charge", IdempotencyKey: key, Body: []byte(body)}
}

// effectHandler writes one effect row through the transaction in its context
// (transactional mode) or the pool (lease mode).
func effectHandler(e *env, worker string, gate func()) sdk.Handler {
	return sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		key, _ := idempotency.KeyFrom(ctx)
		q := `INSERT INTO ` + e.effects() + ` (key, worker) VALUES ($1, $2)`
		if tx, ok := pgstore.TxFrom(ctx); ok {
			if _, err := tx.Exec(ctx, q, key, worker); err != nil {
				return err
			}
		} else if _, err := e.pool.Exec(ctx, q, key, worker); err != nil {
			return err
		}
		if gate != nil {
			gate()
		}
		idempotency.SetResult(ctx, idempotency.Result{ResourceType: "order", ResourceID: key, JSON: []byte(`{"ok":true}`)})
		return nil
	})
}

// Eight concurrent deliveries of one key in transactional mode: the effect
// happens once; the duplicates block on the uncommitted key and then ack.
func TestConcurrentDeliveriesTransactional(t *testing.T) {
	e := newEnv(t)
	var stats idempotency.Stats
	mw, err := idempotency.Middleware(idempotency.Options{Store: e.store, Stats: &stats})
	if err != nil {
		t.Fatal(err)
	}
	key := "charge:order_" + randSuffix() + ":v1"
	const n = 8
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var entered atomic.Int32
	h := mw(effectHandler(e, "w", func() {
		entered.Add(1)
		<-release // hold the key until the others reached it
	}))
	ctx := context.Background()
	var wg sync.WaitGroup
	res := make([]berthtest.Result, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = berthtest.Work(t, h, chargeMsg(key, `{"order":"o1"}`))
		}()
	}
	// Wait until the others are blocked on the uncommitted key row.
	waitFor(t, func() bool { return entered.Load() == 1 && lockWaiters(t, e) >= n-1 })
	once.Do(func() { close(release) })
	wg.Wait()
	for i, r := range res {
		if !r.Acked() {
			t.Errorf("delivery %d settled %q (%v), want ack", i, r.Action, r.Cause)
		}
	}
	if got := e.effectCount(t, key); got != 1 {
		t.Fatalf("effect count = %d, want 1", got)
	}
	s := stats.Snapshot()
	if s.Executed != 1 || s.DuplicatesSuppressed != n-1 {
		t.Fatalf("stats = %+v, want 1 executed and %d duplicates", s, n-1)
	}
	rec, err := e.store.Get(ctx, key)
	if err != nil || rec.Result.ResourceID != key || rec.Status != idempotency.StatusCompleted {
		t.Fatalf("stored record = %+v, %v", rec, err)
	}
}

// lockWaiters counts sessions of this test's database waiting on a lock.
func lockWaiters(t *testing.T, e *env) int {
	var n int
	err := e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, e.schema).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Eight concurrent deliveries of one key in lease mode: one runs, the others
// find it in progress and are retried (never run concurrently, never acked),
// and their retries ack once it completed.
func TestConcurrentDeliveriesLease(t *testing.T) {
	e := newEnv(t)
	var stats idempotency.Stats
	g, err := idempotency.New(idempotency.Options{Store: e.store, Mode: idempotency.Lease, Stats: &stats})
	if err != nil {
		t.Fatal(err)
	}
	key := "charge:order_" + randSuffix() + ":v1"
	const n = 8
	var running, maxRunning atomic.Int32
	othersDone := make(chan struct{})
	h := g.Middleware()(effectHandler(e, "w", func() {
		if r := running.Add(1); r > maxRunning.Load() {
			maxRunning.Store(r)
		}
		<-othersDone // stay in progress while every other delivery tries
		running.Add(-1)
	}))
	var wg, first sync.WaitGroup
	res := make([]berthtest.Result, n)
	first.Add(n - 1)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// No Releaser: a RetryAfter is a counted retry, as on SQS.
			res[i] = berthtest.Work(t, h, chargeMsg(key, `{"order":"o1"}`), berthtest.WithoutRelease())
			if !res[i].Acked() {
				first.Done()
			}
		}()
	}
	first.Wait()
	close(othersDone)
	wg.Wait()
	acked, retried := 0, 0
	for _, r := range res {
		switch r.Action {
		case sdk.ActionAck:
			acked++
		case sdk.ActionRetry:
			retried++
			var ra *sdk.RetryAfterError
			if !errors.As(r.Cause, &ra) || !errors.Is(r.Cause, idempotency.ErrInProgress) {
				t.Errorf("retry cause = %v, want RetryAfter wrapping ErrInProgress", r.Cause)
			}
		default:
			t.Errorf("settled %q: %v", r.Action, r.Cause)
		}
	}
	if acked != 1 || retried != n-1 {
		t.Fatalf("acked %d, retried %d; want 1 and %d", acked, retried, n-1)
	}
	if maxRunning.Load() != 1 {
		t.Fatalf("handler ran %d at once", maxRunning.Load())
	}
	// The retries (redeliveries) now find the key completed and ack.
	for i := range n - 1 {
		r := berthtest.Work(t, h, chargeMsg(key, `{"order":"o1"}`), berthtest.Attempt(2))
		if !r.Acked() {
			t.Fatalf("redelivery %d settled %q: %v", i, r.Action, r.Cause)
		}
	}
	if got := e.effectCount(t, key); got != 1 {
		t.Fatalf("effect count = %d, want 1", got)
	}
	if s := stats.Snapshot(); s.InProgressCollisions != n-1 || s.DuplicatesSuppressed != n-1 || s.Executed != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

// Same key, different payload: dead-lettered with the conflict as reason,
// never given the stored result.
func TestSameKeyDifferentPayloadDeadLettered(t *testing.T) {
	for _, mode := range []idempotency.Mode{idempotency.Transactional, idempotency.Lease} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t)
			var stats idempotency.Stats
			g, err := idempotency.New(idempotency.Options{Store: e.store, Mode: mode, Stats: &stats})
			if err != nil {
				t.Fatal(err)
			}
			h := g.Middleware()(effectHandler(e, "w", nil))
			key := "charge:order_" + randSuffix() + ":v1"
			r1 := berthtest.Work(t, h, chargeMsg(key, `{"amount":100}`))
			r2 := berthtest.Work(t, h, chargeMsg(key, `{"amount":999}`))
			if !r1.Acked() {
				t.Fatalf("first: %s %v", r1.Action, r1.Cause)
			}
			if !r2.DeadLettered() || !errors.Is(r2.Cause, idempotency.ErrKeyConflict) || r2.Class != sdk.ClassPermanent {
				t.Fatalf("second settled %q with %v; want dead_letter with ErrKeyConflict", r2.Action, r2.Cause)
			}
			var ce *idempotency.ConflictError
			if !errors.As(r2.Cause, &ce) || ce.Key != key {
				t.Fatalf("cause %v is not a ConflictError for %s", r2.Cause, key)
			}
			if r2.Reason != r2.Cause.Error() {
				t.Fatalf("dead-letter reason %q, want the conflict's text", r2.Reason)
			}
			// The reason a broker records is the conflict's text.
			dl := r2.Delivery.Message().Clone()
			sdk.AnnotateDeadLetter(dl, "billing", 1, r2.Cause, time.Time{}, time.Now())
			if dl.Header(sdk.HeaderDeadLetterClass) != string(sdk.ClassPermanent) || dl.Header(sdk.HeaderDeadLetterReason) != r2.Cause.Error() {
				t.Fatalf("dead-letter headers = %v", dl.Headers)
			}
			if got := e.effectCount(t, key); got != 1 {
				t.Fatalf("effect count = %d, want 1", got)
			}
			if s := stats.Snapshot(); s.KeyConflicts != 1 {
				t.Fatalf("stats = %+v, want 1 conflict", s)
			}
		})
	}
}

// An expired claim (its worker died) is taken over by exactly one of eight
// competing workers, and the effect happens once.
func TestExpiredLeaseTakeoverUnderEightWorkers(t *testing.T) {
	e := newEnv(t)
	var stats idempotency.Stats
	g, err := idempotency.New(idempotency.Options{Store: e.store, Mode: idempotency.Lease, Stats: &stats, ClaimLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := "charge:order_" + randSuffix() + ":v1"
	msg := chargeMsg(key, `{"order":"o1"}`)
	dead := idempotency.Claim{Key: key, JobType: msg.Type, Fingerprint: idempotency.Fingerprint(msg), Owner: "dead-worker", Lease: 200 * time.Millisecond, Retention: time.Hour}
	if out, _, err := e.store.Claim(ctx, dead); err != nil || out != idempotency.Acquired {
		t.Fatalf("dead worker's claim: %v %v", out, err)
	}
	time.Sleep(400 * time.Millisecond) // past the dead worker's lease

	var runs atomic.Int32
	h := g.Middleware()(effectHandler(e, "w", func() { runs.Add(1) }))
	const n = 8
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			berthtest.Work(t, h, msg.Clone())
		}()
	}
	close(start)
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	if s := stats.Snapshot(); s.LeaseTakeovers != 1 {
		t.Fatalf("stats = %+v, want 1 takeover", s)
	}
	if got := e.effectCount(t, key); got != 1 {
		t.Fatalf("effect count = %d, want 1", got)
	}
	if err := e.store.Complete(ctx, dead, idempotency.Result{}); !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("dead worker's late Complete = %v, want ErrClaimLost", err)
	}
}

// A handler error releases the claim (lease mode) or rolls back the key
// (transactional): the retry runs the handler once more.
func TestHandlerErrorFreesKey(t *testing.T) {
	for _, mode := range []idempotency.Mode{idempotency.Transactional, idempotency.Lease} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t)
			g, err := idempotency.New(idempotency.Options{Store: e.store, Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			fail := errors.New("payment gateway timeout")
			var calls atomic.Int32
			inner := effectHandler(e, "w", nil)
			h := g.Middleware()(sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
				if err := inner.Handle(ctx, d); err != nil {
					return err
				}
				if calls.Add(1) == 1 {
					return fail
				}
				return nil
			}))
			ctx := context.Background()
			key := "charge:order_" + randSuffix() + ":v1"
			d := newDelivery(chargeMsg(key, `{}`))
			if err := h.Handle(ctx, d); !errors.Is(err, fail) {
				t.Fatalf("first = %v, want the handler's error", err)
			}
			if err := h.Handle(ctx, newDelivery(chargeMsg(key, `{}`))); err != nil {
				t.Fatalf("retry = %v", err)
			}
			if err := h.Handle(ctx, newDelivery(chargeMsg(key, `{}`))); err != nil {
				t.Fatalf("duplicate = %v", err)
			}
			if calls.Load() != 2 {
				t.Fatalf("handler ran %d times, want 2 (fail, succeed)", calls.Load())
			}
			want := 1
			if mode == idempotency.Lease {
				want = 2 // the failed attempt's write was outside any transaction
			}
			if got := e.effectCount(t, key); got != want {
				t.Fatalf("effect rows = %d, want %d", got, want)
			}
		})
	}
}

// The fault tests: a worker child process is SIGKILLed at a chosen point and
// the parent, standing in for the broker, redelivers the message.

const (
	envRole   = "BERTH_IDEM_ROLE"
	envSchema = "BERTH_IDEM_SCHEMA"
	envKey    = "BERTH_IDEM_KEY"
)

// helperProcess is the worker child of the crash tests, run by TestMain
// instead of the tests when envRole is set. It never returns.
func helperProcess(role string) {
	ctx := context.Background()
	pool, err := newPool(ctx, os.Getenv("BERTH_POSTGRES_DSN"))
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(2)
	}
	e := &env{schema: os.Getenv(envSchema), pool: pool}
	e.store, err = pgstore.New(pool, pgstore.Options{Schema: e.schema})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(2)
	}
	if strings.HasPrefix(role, "worker-") {
		workerChild(role, e)
	}
	mw, err := idempotency.Middleware(idempotency.Options{Store: e.store})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(2)
	}
	var gate func()
	if role == "before-commit" {
		gate = func() {
			fmt.Println("WROTE")
			select {} // killed here, the transaction open
		}
	}
	err = mw(effectHandler(e, "child", gate)).Handle(ctx, newDelivery(chargeMsg(os.Getenv(envKey), `{"order":"o1"}`)))
	if err == nil {
		fmt.Println("ACKING")
		select {} // killed here: committed, not acked
	}
	fmt.Println("ERR handler", err)
	os.Exit(2)
}

func TestCrashAfterCommitBeforeAck(t *testing.T) {
	testCrash(t, "after-commit", "ACKING", 0)
}

func TestCrashBeforeCommit(t *testing.T) {
	testCrash(t, "before-commit", "WROTE", 1)
}

func testCrash(t *testing.T, role, marker string, wantRuns int) {
	e := newEnv(t)
	key := "charge:order_" + randSuffix() + ":v1"
	killChildAt(t, e, role, marker, key)

	// The broker redelivers; a new worker handles it.
	var stats idempotency.Stats
	mw, err := idempotency.Middleware(idempotency.Options{Store: e.store, Stats: &stats})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := mw(effectHandler(e, "parent", func() { runs.Add(1) }))
	// Before commit, the dead session's transaction may still hold the key
	// for a moment: the redelivery blocks on it, then inserts.
	r := berthtest.Work(t, h, chargeMsg(key, `{"order":"o1"}`), berthtest.Attempt(2),
		berthtest.WorkerOptions(sdk.WorkerOptions{Timeout: 30 * time.Second}))
	if !r.Acked() {
		t.Fatalf("redelivery settled %q: %v", r.Action, r.Cause)
	}
	if int(runs.Load()) != wantRuns {
		t.Fatalf("redelivery ran the handler %d times, want %d", runs.Load(), wantRuns)
	}
	if got := e.effectCount(t, key); got != 1 {
		t.Fatalf("effect count in the database = %d, want 1", got)
	}
}
