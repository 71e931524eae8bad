package redislock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/concurrency/internal/testenv"
	"github.com/berthq/berth/concurrency/redislock"
)

// A panicking fn releases the lock at once (not after a whole TTL), and the
// panic goes on up to the caller unchanged.
func TestRunReleasesOnPanic(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	c := newClient(t, rdb, prefix, redislock.Options{TTL: 30 * time.Second})
	var got any
	func() {
		defer func() { got = recover() }()
		_ = c.Run(ctx, "order:9", func(ctx context.Context, l *redislock.Lock) error { panic("boom") })
	}()
	if got != "boom" {
		t.Errorf("recovered %v, want the panic of fn", got)
	}
	l, err := c.Obtain(ctx, "order:9")
	if err != nil {
		t.Fatalf("after a panicking Run the resource is still locked: %v", err)
	}
	_ = l.Release(ctx)
}

// Once Run's ctx is done, fn sees the cancellation, but the watchdog keeps
// extending the lock while fn finishes: no second holder gets it meanwhile,
// and Run releases it afterwards.
func TestRunKeepsLockWhileFnRunsAfterCancel(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	c := newClient(t, rdb, prefix, redislock.Options{TTL: 300 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stolen, notCancelled atomic.Bool
	err := c.Run(ctx, "order:10", func(wctx context.Context, l *redislock.Lock) error {
		cancel() // e.g. the Worker's job timeout or shutdown
		select {
		case <-wctx.Done():
		case <-time.After(time.Second):
			notCancelled.Store(true)
		}
		time.Sleep(600 * time.Millisecond) // finishing up (two TTLs)
		l2, err := c.Obtain(context.Background(), "order:10")
		if err == nil {
			_ = l2.Release(context.Background())
			stolen.Store(true)
		}
		return nil
	})
	if notCancelled.Load() {
		t.Error("the caller's cancellation did not reach fn")
	}
	if stolen.Load() {
		t.Errorf("a second holder obtained the lock while fn was still running; Run returned %v", err)
	}
	if err != nil {
		t.Errorf("Run = %v, want nil (the lock was held throughout)", err)
	}
	l, oerr := c.Obtain(context.Background(), "order:10")
	if oerr != nil {
		t.Fatalf("lock not released after Run: %v", oerr)
	}
	_ = l.Release(context.Background())
}

// A lock taken by someone else after Run's ctx is done is still noticed by
// the watchdog, and Run reports ErrLockLost.
func TestRunReportsLossAfterCancel(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	c := newClient(t, rdb, prefix, redislock.Options{TTL: 5 * time.Second, ExtendEvery: 20 * time.Millisecond})
	key := prefix + "{acct:8}"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := c.Run(ctx, "acct:8", func(wctx context.Context, l *redislock.Lock) error {
		cancel()
		if err := rdb.Set(context.Background(), key, "someone-else", time.Minute).Err(); err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond) // several extension rounds
		return nil
	})
	if !errors.Is(err, redislock.ErrLockLost) {
		t.Errorf("Run = %v, want ErrLockLost", err)
	}
	if v, _ := rdb.Get(context.Background(), key).Result(); v != "someone-else" {
		t.Errorf("key = %q: Run released a lock it did not own", v)
	}
}

// An extension that hangs (a client that does not honour the deadline in
// mid-call) does not hold the watchdog past the lock's expiry: fn's context
// is cancelled with ErrLockLost about when the lock expires.
func TestRunExtensionHangBounded(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	var hang atomic.Bool
	rdb.AddHook(hangHook{&hang})
	c := newClient(t, rdb, prefix, redislock.Options{TTL: 200 * time.Millisecond, ExtendEvery: 50 * time.Millisecond})
	var after time.Duration
	err := c.Run(context.Background(), "r2", func(ctx context.Context, l *redislock.Lock) error {
		start := time.Now()
		hang.Store(true)
		<-ctx.Done()
		after = time.Since(start)
		hang.Store(false)
		if cause := context.Cause(ctx); !errors.Is(cause, redislock.ErrLockLost) {
			t.Errorf("cause = %v, want ErrLockLost", cause)
		}
		return ctx.Err()
	})
	if !errors.Is(err, redislock.ErrLockLost) {
		t.Errorf("Run = %v, want ErrLockLost", err)
	}
	if after > 700*time.Millisecond {
		t.Errorf("fn learnt of the loss %s after the calls began to hang; the lock expired within 200ms", after)
	}
}

// hangHook makes every command, while hang is set, take 1.5s whatever its
// context says.
type hangHook struct{ hang *atomic.Bool }

func (hangHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h hangHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.hang.Load() {
			time.Sleep(1500 * time.Millisecond)
		}
		return next(ctx, cmd)
	}
}
func (hangHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// pxRecorder is the real client, recording the lifetime (PX, in
// milliseconds) each script of the package is given.
type pxRecorder struct {
	*redis.Client
	mu  sync.Mutex
	pxs []int64
}

func (r *pxRecorder) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if len(args) >= 2 {
		if px, ok := args[1].(int64); ok {
			r.mu.Lock()
			r.pxs = append(r.pxs, px)
			r.mu.Unlock()
		}
	}
	return r.Client.EvalSha(ctx, sha, keys, args...)
}

// TestTTLIsTheLifetimeRedisGives: Redis takes a lock's lifetime in whole
// milliseconds (PX), so a TTL with a fraction of one (20.6ms) gave the key
// 20ms while Lock.TTL, and the watchdog of Run — which counts the lock as
// certainly held until acquisition + TTL — took it to live 20.6ms: fn's
// context was cancelled, and a release failure excused, up to a millisecond
// after Redis had already expired the lock and could hand it to another
// holder.
func TestTTLIsTheLifetimeRedisGives(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	rec := &pxRecorder{Client: rdb}
	c := newClient(t, rec, prefix, redislock.Options{TTL: 20*time.Millisecond + 600*time.Microsecond})
	ctx := context.Background()
	l, err := c.Obtain(ctx, "ttl:1")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	if err := l.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	pxs := append([]int64(nil), rec.pxs...)
	rec.mu.Unlock()
	if len(pxs) < 2 {
		t.Fatalf("recorded lifetimes %v, want the obtain's and the extension's", pxs)
	}
	for _, px := range pxs {
		if given := time.Duration(px) * time.Millisecond; l.TTL() != given {
			t.Errorf("Lock.TTL() = %s, but Redis was given %s", l.TTL(), given)
		}
	}
}

// A Release whose ctx is already done — a deferred l.Release(ctx) in a job
// cancelled by its timeout or a shutdown — still releases the lock. Before,
// go-redis refused the call before sending it, Release returned a bare
// context.Canceled that said nothing of the lock, and the lock stayed in
// Redis, held by nobody, for its whole TTL: every Obtain of the resource
// meanwhile was busy.
func TestReleaseAfterCtxEndedStillReleases(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	c := newClient(t, rdb, prefix, redislock.Options{TTL: 30 * time.Second})
	bg := context.Background()
	ctx, cancel := context.WithCancel(bg)
	l, err := c.Obtain(ctx, "order:21")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release after ctx ended = %v, want nil", err)
	}
	if n, err := rdb.Exists(bg, prefix+"{order:21}").Result(); err != nil || n != 0 {
		t.Errorf("lock key exists = %d, %v after Release: still held by nobody", n, err)
	}
	next, err := c.Obtain(bg, "order:21")
	if err != nil {
		t.Fatalf("Obtain after the released lock = %v, want the lock", err)
	}
	if err := l.Release(ctx); !errors.Is(err, redislock.ErrLockLost) {
		t.Errorf("second Release = %v, want ErrLockLost", err)
	}
	if err := next.Release(bg); err != nil {
		t.Errorf("next holder's Release = %v", err)
	}
}
