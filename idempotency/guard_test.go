package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/sdk"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// effects counts applied effects per key, as a ledger would.
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *effects) add(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[key]++
}

func (e *effects) get(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[key]
}

// runWorker runs a Worker on b until every message of queue is settled.
func runWorker(t *testing.T, b *memory.Broker, queue string, h sdk.Handler, mws ...sdk.Middleware) {
	t.Helper()
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{
		Queue:       queue,
		Concurrency: 8,
		Middleware:  mws,
		Retry:       sdk.RetryPolicy{MaxAttempts: 5, Backoff: sdk.Backoff{Base: 5 * time.Millisecond, Max: 20 * time.Millisecond}},
		Logger:      quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := b.Stats(context.Background(), queue)
		if err != nil {
			t.Fatal(err)
		}
		if s.Ready+s.Delayed+s.InFlight == 0 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("queue not drained: %+v", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("worker: %v", err)
	}
}

func newBroker(t *testing.T) *memory.Broker {
	b, err := memory.New(memory.Options{Lease: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// End to end on the memory broker and the Worker: jobs published twice take
// effect once; the same key with another payload and a message without a key
// are dead-lettered with their reasons.
func TestWorkerEndToEnd(t *testing.T) {
	for _, mode := range []idempotency.Mode{idempotency.Transactional, idempotency.Lease} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			b := newBroker(t)
			var stats idempotency.Stats
			g, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{}), Mode: mode, Stats: &stats, Logger: quiet, InProgressDelay: 5 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			var fx effects
			var flaky atomic.Int32
			h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
				key, _ := idempotency.KeyFrom(ctx)
				if d.Attempt() == 1 && flaky.Add(1)%3 == 0 { // fails once, on the first attempt
					return errors.New("transient gateway error")
				}
				if tx, ok := memstore.TxFrom(ctx); ok {
					tx.OnCommit(func() { fx.add(key) })
				} else {
					fx.add(key)
				}
				return nil
			})
			var msgs []*sdk.Message
			for i := range 20 {
				key := fmt.Sprintf("charge:order_%d:v1", i)
				body := fmt.Sprintf(`{"order":%d}`, i)
				for range 2 {
					msgs = append(msgs, &sdk.Message{Type: "billing.charge", IdempotencyKey: key, Body: []byte(body)})
				}
			}
			missing := &sdk.Message{Type: "billing.charge", Body: []byte(`{}`)}
			msgs = append(msgs, missing)
			if err := b.Publish(ctx, "billing", msgs...); err != nil {
				t.Fatal(err)
			}
			runWorker(t, b, "billing", h, g.Middleware())
			// Once order_0 is charged, its key comes back with another payload.
			conflict := &sdk.Message{Type: "billing.charge", IdempotencyKey: "charge:order_0:v1", Body: []byte(`{"order":999}`)}
			if err := b.Publish(ctx, "billing", conflict); err != nil {
				t.Fatal(err)
			}
			runWorker(t, b, "billing", h, g.Middleware())

			for i := range 20 {
				if n := fx.get(fmt.Sprintf("charge:order_%d:v1", i)); n != 1 {
					t.Errorf("order %d charged %d times", i, n)
				}
			}
			dead, err := b.ListDeadLetters(ctx, "billing", 10)
			if err != nil {
				t.Fatal(err)
			}
			reasons := map[string]string{}
			for _, m := range dead {
				reasons[m.ID] = m.Header(sdk.HeaderDeadLetterReason)
				if c := m.Header(sdk.HeaderDeadLetterClass); c != string(sdk.ClassPermanent) {
					t.Errorf("dead letter %s class %q, want permanent", m.ID, c)
				}
			}
			// The reason names the key by its digest (Options.LogKeys unset).
			wantConflict := `permanent: idempotency: key_sha256 ` + idempotency.KeyDigest(conflict.IdempotencyKey) +
				` reused with a different payload (job type "billing.charge", stored for "billing.charge")`
			wantMissing := sdk.Permanent(&idempotency.MissingKeyError{MessageID: missing.ID, Type: "billing.charge"}).Error()
			if len(dead) != 2 || reasons[conflict.ID] != wantConflict || reasons[missing.ID] != wantMissing {
				t.Fatalf("dead letters = %v, want the conflict and the missing key", reasons)
			}
			s := stats.Snapshot()
			if s.Executed != 20 || s.KeyConflicts != 1 || s.MissingKeys != 1 || s.DuplicatesSuppressed < 1 {
				t.Fatalf("stats = %+v", s)
			}
		})
	}
}

func TestMissingKeyFallsBackToMessageID(t *testing.T) {
	g, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{}), MissingKey: idempotency.MissingKeyUseMessageID})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := g.Middleware()(sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if key, _ := idempotency.KeyFrom(ctx); key != d.Message().ID {
			t.Errorf("key %q, want the message ID", key)
		}
		runs.Add(1)
		return nil
	}))
	m := &sdk.Message{ID: sdk.NewID(), Type: "email.welcome", Body: []byte("user_456")}
	for range 3 { // a redelivery carries the same ID
		if err := h.Handle(context.Background(), berthtest.NewDelivery(m)); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("ran %d times, want 1", runs.Load())
	}
}

// brokenCache fails every call, as an unreachable Redis does.
type brokenCache struct{ calls atomic.Int32 }

func (c *brokenCache) Lookup(context.Context, string) (string, bool, error) {
	c.calls.Add(1)
	return "", false, errors.New("dial tcp: connection refused")
}

func (c *brokenCache) Remember(context.Context, string, string, time.Duration) error {
	c.calls.Add(1)
	return errors.New("dial tcp: connection refused")
}

func TestBrokenCacheFallsBackToStore(t *testing.T) {
	var stats idempotency.Stats
	cache := &brokenCache{}
	g, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{}), Cache: cache, Stats: &stats, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	op := idempotency.Operation{Key: "k", JobType: "t", Fingerprint: "fp"}
	for range 3 {
		if _, err := g.Do(context.Background(), op, func(context.Context) error { runs.Add(1); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("ran %d times, want 1", runs.Load())
	}
	if s := stats.Snapshot(); s.CacheErrors == 0 || s.DuplicatesSuppressed != 2 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestPanicFreesKey(t *testing.T) {
	for _, mode := range []idempotency.Mode{idempotency.Transactional, idempotency.Lease} {
		t.Run(mode.String(), func(t *testing.T) {
			store := memstore.New(memstore.Options{})
			g, err := idempotency.New(idempotency.Options{Store: store, Mode: mode, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			op := idempotency.Operation{Key: "k", JobType: "t", Fingerprint: "fp"}
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("panic not propagated")
					}
				}()
				_, _ = g.Do(context.Background(), op, func(context.Context) error { panic("boom") })
			}()
			ran, err := g.Do(context.Background(), op, func(context.Context) error { return nil })
			if err != nil || !ran {
				t.Fatalf("after a panic: ran=%v err=%v, want the retry to run", ran, err)
			}
		})
	}
}

// A heartbeat keeps a long handler's claim alive past ClaimLease; without
// it the claim is taken over and the late Complete reports ErrClaimLost.
func TestHeartbeatAndClaimLost(t *testing.T) {
	ctx := context.Background()
	op := idempotency.Operation{Key: "k", JobType: "t", Fingerprint: "fp"}
	for _, tc := range []struct {
		name      string
		heartbeat time.Duration
		wantLost  bool
	}{{"heartbeat", 50 * time.Millisecond, false}, {"no heartbeat", -1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			store := memstore.New(memstore.Options{})
			var stats idempotency.Stats
			g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease, ClaimLease: time.Second, Heartbeat: tc.heartbeat, Stats: &stats, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			var secondRan atomic.Bool
			_, err = g.Do(ctx, op, func(context.Context) error {
				// Well past ClaimLease. A lease of a second, not 300 ms:
				// a heartbeat stalled for most of it on a loaded machine
				// would let the claim be taken over.
				time.Sleep(2500 * time.Millisecond)
				ran, err := g.Do(ctx, op, func(context.Context) error { secondRan.Store(true); return nil })
				if tc.wantLost && (!ran || err != nil) {
					t.Errorf("takeover: ran=%v err=%v", ran, err)
				}
				if !tc.wantLost && !errors.Is(err, idempotency.ErrInProgress) {
					t.Errorf("duplicate during a live claim: %v, want ErrInProgress", err)
				}
				return nil
			})
			if tc.wantLost != errors.Is(err, idempotency.ErrClaimLost) {
				t.Fatalf("first Do = %v; want ErrClaimLost: %v", err, tc.wantLost)
			}
			if secondRan.Load() != tc.wantLost {
				t.Fatalf("second ran = %v", secondRan.Load())
			}
			if s := stats.Snapshot(); (s.LeaseTakeovers == 1) != tc.wantLost {
				t.Fatalf("stats = %+v", s)
			}
		})
	}
}

func TestInbox(t *testing.T) {
	g, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	in := g.Inbox()
	ev := idempotency.InboxEvent{Source: "stripe", ID: "evt_1", Type: "payment_intent.succeeded", Payload: []byte(`{"amount":1200}`)}
	var applied atomic.Int32
	for i := range 3 {
		processed, err := in.Process(context.Background(), ev, func(context.Context) error { applied.Add(1); return nil })
		if err != nil || processed != (i == 0) {
			t.Fatalf("delivery %d: processed=%v err=%v", i, processed, err)
		}
	}
	ev2 := ev
	ev2.Payload = []byte(`{"amount":9999}`)
	if _, err := in.Process(context.Background(), ev2, func(context.Context) error { return nil }); !errors.Is(err, idempotency.ErrKeyConflict) {
		t.Fatalf("same event ID, other payload: %v, want ErrKeyConflict", err)
	}
	if _, err := in.Process(context.Background(), idempotency.InboxEvent{Source: "stripe"}, func(context.Context) error { return nil }); !errors.Is(err, idempotency.ErrMissingKey) || !sdk.IsPermanent(err) {
		t.Fatalf("event without ID: %v, want permanent ErrMissingKey", err)
	}
	if applied.Load() != 1 {
		t.Fatalf("applied %d times", applied.Load())
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	store := memstore.New(memstore.Options{})
	for name, o := range map[string]idempotency.Options{
		"no store":         {},
		"unknown mode":     {Store: store, Mode: 7},
		"negative lease":   {Store: store, ClaimLease: -time.Second},
		"unknown policy":   {Store: store, MissingKey: 9},
		"tx without store": {Store: leaseOnly{store}, Mode: idempotency.Transactional},
		"slow heartbeat":   {Store: store, Mode: idempotency.Lease, ClaimLease: time.Minute, Heartbeat: 31 * time.Second},
	} {
		if _, err := idempotency.New(o); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	g, err := idempotency.New(idempotency.Options{Store: leaseOnly{store}})
	if err != nil || g.Mode() != idempotency.Lease {
		t.Fatalf("default mode for a lease-only store = %v, %v", g, err)
	}
}

// leaseOnly hides the memory store's transactions.
type leaseOnly struct{ idempotency.Store }

func TestFingerprint(t *testing.T) {
	a := idempotency.Fingerprint(&sdk.Message{Type: "a", Body: []byte("bc")})
	b := idempotency.Fingerprint(&sdk.Message{Type: "ab", Body: []byte("c")})
	c := idempotency.Fingerprint(&sdk.Message{ID: "other", Type: "a", Body: []byte("bc"), Headers: map[string]string{"x": "y"}})
	if a == b || a != c || len(a) != 64 {
		t.Fatalf("fingerprints %s %s %s", a, b, c)
	}
}

func TestPurgeExpired(t *testing.T) {
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	store := memstore.New(memstore.Options{Now: clock})
	g, err := idempotency.New(idempotency.Options{Store: store, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 25 {
		if _, err := g.Do(context.Background(), idempotency.Operation{Key: fmt.Sprint(i)}, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	n, err := idempotency.PurgeExpired(context.Background(), store, 10)
	if err != nil || n != 25 {
		t.Fatalf("PurgeExpired = %d, %v; want 25", n, err)
	}
}

func TestRunJanitor(t *testing.T) {
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	store := memstore.New(memstore.Options{Now: clock})
	g, err := idempotency.New(idempotency.Options{Store: store, Retention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := g.Do(context.Background(), idempotency.Operation{Key: fmt.Sprint(i)}, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	deleted := make(chan int, 10)
	done := make(chan error, 1)
	go func() {
		done <- idempotency.RunJanitor(ctx, store, 10*time.Millisecond, 2, func(n int, err error) {
			if err != nil {
				t.Error(err)
			}
			deleted <- n
		})
	}()
	if n := <-deleted; n != 5 {
		t.Fatalf("first janitor run deleted %d, want 5", n)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunJanitor = %v, want context.Canceled", err)
	}
}

// failingExtend is a store whose Extend always fails transiently (a database
// unreachable for longer than the claim lease): a failure path a real server
// cannot produce on demand.
type failingExtend struct{ idempotency.Store }

func (failingExtend) Extend(context.Context, idempotency.Claim, time.Duration) error {
	return errors.New("connection refused")
}

// When the heartbeat cannot extend the claim before it expires, another
// worker may take it over: the handler is cancelled with ErrClaimLost instead
// of running on, unfenced, next to the new owner.
func TestHeartbeatFailingPastLeaseCancelsHandler(t *testing.T) {
	store := failingExtend{memstore.New(memstore.Options{})}
	g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease,
		ClaimLease: 300 * time.Millisecond, Heartbeat: 50 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "k", JobType: "t", Fingerprint: "fp"}
	var cancelled atomic.Bool
	_, err = g.Do(context.Background(), op, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			cancelled.Store(true)
			return ctx.Err()
		case <-time.After(5 * time.Second): // far past ClaimLease
			return nil
		}
	})
	if !cancelled.Load() {
		t.Fatal("the handler ran on past its claim's expiry")
	}
	if !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("Do = %v, want ErrClaimLost", err)
	}
}

// A handler that runs on past its ctx (now allowed: the heartbeat goes on)
// and fails after its claim was lost is reported with ErrClaimLost and
// counted as claim_lost, as before its ctx ended: the claim lost after the
// ctx was done could not become the ctx's cause (the first cause stays), and
// Do read the loss only from there.
func TestClaimLostAfterContextEndedIsReported(t *testing.T) {
	store := failingExtend{memstore.New(memstore.Options{})}
	var stats idempotency.Stats
	g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease,
		ClaimLease: 300 * time.Millisecond, Heartbeat: 50 * time.Millisecond, Stats: &stats, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err = g.Do(ctx, idempotency.Operation{Key: "k", JobType: "t"}, func(hctx context.Context) error {
		cancel()                // shutdown
		<-hctx.Done()           // the handler sees it
		time.Sleep(time.Second) // and finishes its call anyway, past the claim
		return errors.New("upstream: 502")
	})
	if !errors.Is(err, idempotency.ErrClaimLost) {
		t.Errorf("Do = %v, want it to wrap ErrClaimLost", err)
	}
	if n := stats.Snapshot().ClaimsLost; n != 1 {
		t.Errorf("claims lost = %d, want 1", n)
	}
}

// A delivery that finds its key claimed by a crashed worker, on a broker
// where every retry counts a receive (SQS: no sdk.Releaser), is retried when
// the claim expires, not every InProgressDelay: retries that cannot succeed
// before the expiry would exhaust the receive limit and dead-letter the only
// message that can take the claim over, and the operation would never run.
// A Releaser's delivery keeps the short delay (it costs no attempt, and sees
// an early completion sooner).
func TestInProgressDelayUntilClaimExpiryWhenRetriesCount(t *testing.T) {
	store := memstore.New(memstore.Options{})
	const claimLease = time.Minute
	g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease, ClaimLease: claimLease, InProgressDelay: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	m := &sdk.Message{ID: sdk.NewID(), Type: "t", IdempotencyKey: "k", Body: []byte("x")}
	// The crashed worker's claim.
	c := idempotency.Claim{Key: "k", JobType: "t", Fingerprint: idempotency.Fingerprint(m), Owner: "dead", Lease: claimLease, Retention: time.Hour}
	if out, _, err := store.Claim(context.Background(), c); out != idempotency.Acquired || err != nil {
		t.Fatalf("Claim = %v, %v", out, err)
	}
	h := g.Middleware()(sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
		t.Error("handler ran while the key is claimed")
		return nil
	}))
	for _, tc := range []struct {
		name     string
		d        sdk.Delivery
		min, max time.Duration
	}{
		{"counted retries", berthtest.NewDelivery(m).WithoutRelease(), claimLease - 10*time.Second, claimLease + time.Second},
		{"releaser", berthtest.NewDelivery(m), time.Second, time.Second},
	} {
		err := h.Handle(context.Background(), tc.d)
		var ra *sdk.RetryAfterError
		if !errors.As(err, &ra) || !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("%s: %v, want RetryAfter wrapping ErrInProgress", tc.name, err)
		}
		if ra.Delay < tc.min || ra.Delay > tc.max {
			t.Errorf("%s: retry after %s, want within [%s, %s]", tc.name, ra.Delay, tc.min, tc.max)
		}
	}
}

// flakyComplete is a store whose Complete fails transiently a few times (a
// connection dropped under the call): a failure a real server cannot produce
// on demand.
type flakyComplete struct {
	idempotency.Store
	failures atomic.Int32
}

func (s *flakyComplete) Complete(ctx context.Context, c idempotency.Claim, r idempotency.Result) error {
	if s.failures.Add(-1) >= 0 {
		return errors.New("conn closed")
	}
	return s.Store.Complete(ctx, c, r)
}

// In lease mode the effect is already applied when Complete runs: a
// transient failure there is retried (it is fenced by the owner token, so
// retrying is safe) instead of leaving the claim in progress, to expire and
// be taken over by a redelivery that would apply the effect again.
func TestCompleteRetriedAfterTransientFailure(t *testing.T) {
	mem := memstore.New(memstore.Options{})
	store := &flakyComplete{Store: mem}
	store.failures.Store(2)
	g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "k", JobType: "t", Fingerprint: "fp"}
	if ran, err := g.Do(context.Background(), op, func(context.Context) error { return nil }); !ran || err != nil {
		t.Fatalf("Do = %v, %v; want the effect recorded despite two transient Complete failures", ran, err)
	}
	rec, err := mem.Get(context.Background(), "k")
	if err != nil || rec.Status != idempotency.StatusCompleted {
		t.Fatalf("record = %+v, %v; want completed", rec, err)
	}
}

// Issue 11 item 8: a completion retried for CleanupTimeout must end before a
// claim extended one Heartbeat earlier expires, or another worker could take
// the key over meanwhile; New refuses such a configuration.
func TestHardening8_CleanupTimeoutWithinClaim(t *testing.T) {
	store := memstore.New(memstore.Options{})
	for name, tc := range map[string]struct {
		o  idempotency.Options
		ok bool
	}{
		"cleanup = lease - heartbeat":   {idempotency.Options{ClaimLease: 10 * time.Second, Heartbeat: 3 * time.Second, CleanupTimeout: 7 * time.Second}, false},
		"cleanup > lease - heartbeat":   {idempotency.Options{ClaimLease: 10 * time.Second, Heartbeat: 3 * time.Second, CleanupTimeout: 8 * time.Second}, false},
		"cleanup < lease - heartbeat":   {idempotency.Options{ClaimLease: 10 * time.Second, Heartbeat: 3 * time.Second, CleanupTimeout: 6 * time.Second}, true},
		"no heartbeat, cleanup = lease": {idempotency.Options{ClaimLease: 10 * time.Second, Heartbeat: -1, CleanupTimeout: 10 * time.Second}, false},
		"no heartbeat, cleanup < lease": {idempotency.Options{ClaimLease: 10 * time.Second, Heartbeat: -1, CleanupTimeout: 9 * time.Second}, true},
		"default cleanup, short lease":  {idempotency.Options{ClaimLease: 300 * time.Millisecond}, true},
		"defaults":                      {idempotency.Options{}, true},
	} {
		for _, mode := range []idempotency.Mode{idempotency.Lease, idempotency.Transactional} {
			o := tc.o
			o.Store, o.Mode = store, mode
			_, err := idempotency.New(o)
			if tc.ok && err != nil {
				t.Errorf("%s (%v): %v, want nil", name, mode, err)
			}
			if !tc.ok && !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Errorf("%s (%v): %v, want ErrInvalidConfig", name, mode, err)
			}
		}
	}
}

// failingRollback is a TxStore whose transactions cannot be rolled back.
type failingRollback struct{ *memstore.Store }

func (s failingRollback) Begin(ctx context.Context, c idempotency.Claim) (idempotency.Tx, idempotency.Outcome, *idempotency.Record, error) {
	tx, out, rec, err := s.Store.Begin(ctx, c)
	if tx != nil {
		tx = failingTx{tx}
	}
	return tx, out, rec, err
}

type failingTx struct{ idempotency.Tx }

func (t failingTx) Rollback(ctx context.Context) error {
	_ = t.Tx.Rollback(ctx)
	return errors.New("connection reset")
}

// Issue 11 item 6: in transactional mode there is no claim to expire; a
// failed rollback must not be reported as "the key frees itself when its
// claim expires".
func TestHardening6_TransactionalRollbackWarningNamesNoClaim(t *testing.T) {
	var logs syncbuf.Buffer
	g, err := idempotency.New(idempotency.Options{Store: failingRollback{memstore.New(memstore.Options{})},
		Mode: idempotency.Transactional, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if _, err := g.Do(context.Background(), idempotency.Operation{Key: "k"}, func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want boom", err)
	}
	out := logs.String()
	if !strings.Contains(out, "rollback failed") || strings.Contains(out, "claim") {
		t.Errorf("log after a failed rollback in transactional mode:\n%s", out)
	}
}

// TestHardening11_IdempotencyKeysHashedInLogs: issue 11 item 11. The guard
// logged idempotency keys (which often name a customer or a payment) as they
// are, at WARN when a store call failed. By default a record names the key
// by its digest; Options.LogKeys restores the key itself.
func TestHardening11_IdempotencyKeysHashedInLogs(t *testing.T) {
	const key = "payment:customer-4711:invoice-2026-12"
	for _, logKeys := range []bool{false, true} {
		var logs syncbuf.Buffer
		store := &flakyComplete{Store: memstore.New(memstore.Options{})}
		store.failures.Store(1)
		g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease, LogKeys: logKeys,
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			t.Fatal(err)
		}
		op := idempotency.Operation{Key: key, JobType: "t", Fingerprint: "fp"}
		for range 2 { // the second run is a duplicate: a debug record
			if _, err := g.Do(context.Background(), op, func(context.Context) error { return nil }); err != nil {
				t.Fatalf("Do: %v", err)
			}
		}
		out := logs.String()
		if !strings.Contains(out, "level=WARN msg=\"idempotency: recording the result failed; retrying\"") ||
			!strings.Contains(out, "duplicate suppressed") {
			t.Fatalf("LogKeys %v: want the WARN of the failed Complete and the duplicate's record; logs:\n%s", logKeys, out)
		}
		digest := "key_sha256=" + idempotency.KeyDigest(key)
		if logKeys {
			if !strings.Contains(out, "key="+key) {
				t.Errorf("LogKeys true: the key is missing from the logs:\n%s", out)
			}
			continue
		}
		if strings.Contains(out, key) {
			t.Errorf("LogKeys false: the key appears in the logs:\n%s", out)
		}
		if strings.Count(out, digest) != 2 {
			t.Errorf("LogKeys false: want %s in both records:\n%s", digest, out)
		}
	}
}

// TestHardening11_ClaimLostCauseNamesKeyByDigest: issue 11 item 11. The
// cause that cancels a handler whose claim could not be extended quoted the
// key; the Worker logs that cause at WARN and may store it as a dead-letter
// reason. It names the key by its digest unless Options.LogKeys.
func TestHardening11_ClaimLostCauseNamesKeyByDigest(t *testing.T) {
	const key = "payment:customer-4711:invoice-2026-12"
	g, err := idempotency.New(idempotency.Options{Store: failingExtend{memstore.New(memstore.Options{})}, Mode: idempotency.Lease,
		ClaimLease: 300 * time.Millisecond, Heartbeat: 50 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: key, JobType: "t", Fingerprint: "fp"}
	_, err = g.Do(context.Background(), op, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(5 * time.Second):
			return nil
		}
	})
	if !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("Do = %v, want ErrClaimLost", err)
	}
	if strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), idempotency.KeyDigest(key)) {
		t.Errorf("claim-lost cause %q: want the key's digest %s, not the key", err, idempotency.KeyDigest(key))
	}
}
