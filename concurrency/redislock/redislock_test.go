package redislock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/concurrency/internal/testenv"
	"github.com/berthq/berth/concurrency/redislock"
	"github.com/berthq/berth/sdk"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newClient(t *testing.T, rdb redis.Scripter, prefix string, o redislock.Options) *redislock.Client {
	t.Helper()
	o.Prefix = prefix
	c, err := redislock.New(rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewValidates(t *testing.T) {
	rdb, _ := testenv.Redis(t)
	for _, o := range []redislock.Options{
		{TTL: -time.Second},
		{TTL: time.Millisecond},
		{TTL: time.Second, ExtendEvery: time.Second},
		{BusyDelay: -1},
	} {
		if _, err := redislock.New(rdb, o); !errors.Is(err, redislock.ErrInvalidOptions) {
			t.Errorf("New(%+v) = %v, want ErrInvalidOptions", o, err)
		}
	}
	if _, err := redislock.New(nil, redislock.Options{}); !errors.Is(err, redislock.ErrInvalidOptions) {
		t.Errorf("New(nil client) = %v, want ErrInvalidOptions", err)
	}
}

// A hash tag in Prefix comes before the resource's, and Redis Cluster
// hashes a key by its first tag: "app:{tenant}:" put every lock in one slot
// (one node), and "app:{}:" (an empty tag: each key hashed whole) put a
// lock and its fencing counter in different slots, every Obtain refused
// with CROSSSLOT. New refuses a brace in Prefix.
func TestNewRefusesHashTagInPrefix(t *testing.T) {
	rdb, _ := testenv.Redis(t)
	for _, p := range []string{"app:{tenant}:", "app:{}:", "{", "app:}"} {
		if _, err := redislock.New(rdb, redislock.Options{Prefix: p}); !errors.Is(err, redislock.ErrInvalidOptions) || !strings.Contains(err.Error(), p) {
			t.Errorf("New(Prefix %q) = %v, want ErrInvalidOptions naming it", p, err)
		}
	}
	if _, err := redislock.New(rdb, redislock.Options{Prefix: "app:tenant:"}); err != nil {
		t.Errorf("New(Prefix without braces) = %v", err)
	}
}

func TestObtainBusyReleaseAndTokens(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	c := newClient(t, rdb, prefix, redislock.Options{TTL: 10 * time.Second, BusyDelay: 200 * time.Millisecond})
	if _, err := c.Obtain(ctx, ""); !errors.Is(err, redislock.ErrInvalidResource) {
		t.Errorf("empty resource = %v", err)
	}
	a, err := c.Obtain(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Obtain(ctx, "order:1")
	var be *redislock.BusyError
	var ra *sdk.RetryAfterError
	if !errors.Is(err, redislock.ErrBusy) || !errors.As(err, &be) || !errors.As(err, &ra) {
		t.Fatalf("second Obtain = %v, want RetryAfter(BusyError)", err)
	}
	if be.Remaining <= 0 || ra.Delay != 200*time.Millisecond {
		t.Errorf("busy: remaining %s, delay %s; want remaining > 0 and the 200ms BusyDelay", be.Remaining, ra.Delay)
	}
	other, err := c.Obtain(ctx, "order:2")
	if err != nil {
		t.Fatalf("another resource: %v", err)
	}
	if err := a.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); !errors.Is(err, redislock.ErrLockLost) {
		t.Errorf("second Release = %v, want ErrLockLost", err)
	}
	b, err := c.Obtain(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	if b.Token() <= a.Token() {
		t.Errorf("tokens %d then %d: not increasing", a.Token(), b.Token())
	}
	for _, l := range []*redislock.Lock{b, other} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// An expired holder can neither extend nor release its successor's lock.
func TestExpiredHolderCannotTouchSuccessor(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	short := newClient(t, rdb, prefix, redislock.Options{TTL: 50 * time.Millisecond})
	long := newClient(t, rdb, prefix, redislock.Options{TTL: 10 * time.Second})
	a, err := short.Obtain(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	var b *redislock.Lock
	for b == nil { // until a's lock has expired
		b, err = long.Obtain(ctx, "r")
		if err != nil && !errors.Is(err, redislock.ErrBusy) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := a.Extend(ctx); !errors.Is(err, redislock.ErrLockLost) {
		t.Errorf("expired Extend = %v, want ErrLockLost", err)
	}
	if err := a.Release(ctx); !errors.Is(err, redislock.ErrLockLost) {
		t.Errorf("expired Release = %v, want ErrLockLost", err)
	}
	if _, err := long.Obtain(ctx, "r"); !errors.Is(err, redislock.ErrBusy) {
		t.Errorf("successor's lock gone after the expired holder's calls: %v", err)
	}
	if b.Token() <= a.Token() {
		t.Errorf("successor token %d not above %d", b.Token(), a.Token())
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The watchdog keeps extending the lock while the work runs: the key's
// remaining TTL is seen to go back up several times.
func TestRunWatchdogExtends(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	c := newClient(t, rdb, prefix, redislock.Options{TTL: 2 * time.Second, ExtendEvery: 50 * time.Millisecond})
	err := c.Run(ctx, "job", func(ctx context.Context, l *redislock.Lock) error {
		key := prefix + "{job}"
		rises, last := 0, time.Duration(1<<62)
		for rises < 3 {
			pttl, err := rdb.PTTL(ctx, key).Result()
			if err != nil {
				return err
			}
			if pttl <= 0 {
				t.Errorf("lock key gone while the work runs (pttl %s)", pttl)
				return nil
			}
			if pttl > last {
				rises++
			}
			last = pttl
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := c.Obtain(ctx, "job"); !errors.Is(err, redislock.ErrBusy) {
			t.Errorf("Obtain during Run = %v, want busy", err)
		}
		return ctx.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, prefix+"{job}").Result(); n != 0 {
		t.Error("lock not released after Run")
	}
}

// When another owner takes the key, the watchdog's next extension fails and
// the work's context is cancelled with ErrLockLost; Run reports it and leaves
// the other owner's key alone.
func TestRunCancelsWorkWhenLockTaken(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	c := newClient(t, rdb, prefix, redislock.Options{TTL: 5 * time.Second, ExtendEvery: 20 * time.Millisecond})
	key := prefix + "{acct:7}"
	fnErr := errors.New("work stopped")
	err := c.Run(ctx, "acct:7", func(ctx context.Context, l *redislock.Lock) error {
		if err := rdb.Set(ctx, key, "someone-else", time.Minute).Err(); err != nil {
			return err
		}
		<-ctx.Done()
		if cause := context.Cause(ctx); !errors.Is(cause, redislock.ErrLockLost) {
			t.Errorf("cause = %v, want ErrLockLost", cause)
		}
		return fnErr
	})
	if !errors.Is(err, redislock.ErrLockLost) || !errors.Is(err, fnErr) {
		t.Errorf("Run = %v, want ErrLockLost joined with the work's error", err)
	}
	if v, _ := rdb.Get(ctx, key).Result(); v != "someone-else" {
		t.Errorf("key = %q: Run released a lock it did not own", v)
	}
}

// When Redis cannot be reached, the watchdog gives up once the lock's expiry
// has passed unconfirmed. A real server cannot be made unreachable for one
// client on demand (pausing the shared server would hit everyone's tests), so
// a go-redis hook fails the calls.
func TestRunCancelsWorkWhenExtensionsFail(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	var broken atomic.Bool
	rdb.AddHook(failHook{&broken})
	ctx := context.Background()
	c := newClient(t, rdb, prefix, redislock.Options{TTL: 200 * time.Millisecond, ExtendEvery: 50 * time.Millisecond})
	err := c.Run(ctx, "r", func(ctx context.Context, l *redislock.Lock) error {
		broken.Store(true)
		<-ctx.Done()
		return ctx.Err()
	})
	broken.Store(false)
	if !errors.Is(err, redislock.ErrLockLost) {
		t.Errorf("Run = %v, want ErrLockLost", err)
	}
}

type failHook struct{ broken *atomic.Bool }

func (failHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h failHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.broken.Load() {
			err := &net.OpError{Op: "write", Net: "tcp", Err: errors.New("injected network failure")}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h failHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// The middleware hands a busy resource back as RetryAfter without running the
// handler and without consuming an attempt; once the lock is free the handler
// runs under it and sees the lock's fencing token.
func TestMiddlewareBusyIsReleasedNotFailed(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	c := newClient(t, rdb, prefix, redislock.Options{TTL: 5 * time.Second, BusyDelay: 20 * time.Millisecond})
	broker := berthtest.Memory(t)
	queue := "conc-" + testenv.Suffix()

	held, err := c.Obtain(ctx, "order:42")
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	var seenToken atomic.Int64
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		ran.Add(1)
		l, ok := redislock.FromContext(ctx)
		if !ok {
			return sdk.Permanent(errors.New("no lock in context"))
		}
		seenToken.Store(l.Token())
		return nil
	})
	key := func(m *sdk.Message) (string, error) {
		id := m.Header("order")
		if id == "" {
			return "", sdk.Permanent(errors.New("message names no order"))
		}
		return "order:" + id, nil
	}
	rec := berthtest.StartWorker(t, broker, h, sdk.WorkerOptions{
		Queue: queue, Concurrency: 2,
		Middleware: []sdk.Middleware{c.Middleware(key)},
	})
	if err := broker.Publish(ctx, queue, &sdk.Message{Type: "charge", Headers: map[string]string{"order": "42"}}); err != nil {
		t.Fatal(err)
	}
	// Busy twice, then free the resource.
	rec.Wait(t, 2)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rec.WaitDone(t, 1)
	// A release can be recorded after the ack that followed it (observers
	// hear of a release once the broker took it), so the order is not checked.
	all := rec.Records()
	acks := 0
	for i, s := range all {
		if s.Attempt != 1 {
			t.Errorf("settlement %d at attempt %d: a busy resource consumed an attempt", i, s.Attempt)
		}
		if s.Action == sdk.ActionAck {
			acks++
			continue
		}
		if s.Action != sdk.ActionRelease || s.Class != sdk.ClassRetryAfter ||
			!errors.Is(s.Cause, redislock.ErrBusy) || s.Delay > 20*time.Millisecond {
			t.Errorf("settlement %d = %+v, want a release for a busy resource", i, s.Settlement)
		}
	}
	if acks != 1 || len(all) < 3 {
		t.Errorf("%d acks in %d settlements, want one ack after at least two releases", acks, len(all))
	}
	if ran.Load() != 1 {
		t.Errorf("handler ran %d times, want once (never while busy)", ran.Load())
	}
	if seenToken.Load() <= held.Token() {
		t.Errorf("handler saw token %d, want above the earlier holder's %d", seenToken.Load(), held.Token())
	}
}

// With the middleware the resource name comes from a message: the errors
// that carry it (logged by the Worker, shown by operators' tools) quote it,
// so a control sequence in it does not reach a terminal.
func TestErrorsQuoteTheResource(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	c := newClient(t, rdb, prefix, redislock.Options{TTL: time.Minute})
	const resource = "order:1\x1b]0;owned\a\u202e"
	l, err := c.Obtain(ctx, resource)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	err = l.Release(ctx) // a second release: ErrLockLost, naming the resource
	if !errors.Is(err, redislock.ErrLockLost) {
		t.Fatalf("second Release = %v, want ErrLockLost", err)
	}
	if msg := err.Error(); strings.ContainsAny(msg, "\x1b\a\u202e") {
		t.Errorf("error carries the resource's control characters raw: %q", msg)
	}
}
