package redislock_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/concurrency/internal/testenv"
	"github.com/berthq/berth/concurrency/redislock"
	"github.com/berthq/berth/integration"
)

// When the reply to Obtain is lost after Redis ran the script (the
// connection drops in between), go-redis retries the script on a new
// connection. The retry must not find the lock it took itself "busy": that
// left the resource locked by nobody's Lock for a whole TTL, every worker,
// this one included, told to come back later. A real server cannot lose a
// reply on demand, so the client goes through a proxy that drops the
// connection instead of passing one reply on.
func TestObtainRetriedAfterLostReplyGetsItsOwnLock(t *testing.T) {
	rdb, prefix, c, proxy := lossyClient(t, 3, true)
	ctx := context.Background()

	proxy.dropNextReply.Store(true)
	l, err := c.Obtain(ctx, "order:11")
	if proxy.dropNextReply.Load() {
		t.Fatal("no reply was dropped")
	}
	if err != nil {
		var be *redislock.BusyError
		if errors.As(err, &be) {
			t.Fatalf("Obtain = %v: the retry found its own lock busy", err)
		}
		t.Fatalf("Obtain = %v", err)
	}
	fence, err := rdb.Get(ctx, prefix+"{order:11}:fence").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() != fence {
		t.Errorf("token %d, want the counter's %d: the one acquisition took one token", l.Token(), fence)
	}
	if _, err := c.Obtain(ctx, "order:11"); !errors.Is(err, redislock.ErrBusy) {
		t.Errorf("second Obtain = %v, want busy", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release = %v: the lock was not the Lock's", err)
	}
	if n, _ := rdb.Exists(ctx, prefix+"{order:11}").Result(); n != 0 {
		t.Error("lock still held after Release")
	}
}

// When the reply to Release is lost after Redis ran the script, go-redis
// runs it again on a new connection; the lock is gone by then, deleted by
// the first run. Release must still report the release it made, not
// ErrLockLost: that told the caller its work ran unprotected, and Run
// returned ErrLockLost for work done entirely under the lock, so the job
// was retried and the work done again.
func TestReleaseRetriedAfterLostReplyReportsTheRelease(t *testing.T) {
	rdb, prefix, c, proxy := lossyClient(t, 3, true)
	ctx := context.Background()

	l, err := c.Obtain(ctx, "order:12")
	if err != nil {
		t.Fatal(err)
	}
	proxy.dropNextReply.Store(true)
	err = l.Release(ctx)
	if proxy.dropNextReply.Load() {
		t.Fatal("no reply was dropped")
	}
	if err != nil {
		t.Fatalf("Release = %v, want nil: the lock was ours and the first run deleted it", err)
	}
	if n, _ := rdb.Exists(ctx, prefix+"{order:12}").Result(); n != 0 {
		t.Error("lock still held after Release")
	}
	// A second Release of the same Lock is still told apart.
	if err := l.Release(ctx); !errors.Is(err, redislock.ErrLockLost) {
		t.Errorf("second Release = %v, want ErrLockLost", err)
	}
	// The next holder's lock is its own: a stale Lock cannot release it.
	next, err := c.Obtain(ctx, "order:12")
	if err != nil {
		t.Fatalf("Obtain after Release = %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, redislock.ErrLockLost) {
		t.Errorf("stale Release = %v, want ErrLockLost", err)
	}
	if err := next.Release(ctx); err != nil {
		t.Errorf("next holder's Release = %v", err)
	}
}

// Run's release goes the same way: work done under a lock held throughout
// is not reported lost because the release's reply was.
func TestRunReleaseLostReplyIsNotALostLock(t *testing.T) {
	_, _, c, proxy := lossyClient(t, 3, true)
	ctx := context.Background()

	err := c.Run(ctx, "order:13", func(ctx context.Context, l *redislock.Lock) error {
		proxy.dropNextReply.Store(true) // the next reply is the release's
		return nil
	})
	if proxy.dropNextReply.Load() {
		t.Fatal("no reply was dropped")
	}
	if err != nil {
		t.Fatalf("Run = %v, want nil: the lock was held until released", err)
	}
}

// A release that fails outright (its reply lost, and no retry: the outcome
// is unknown) does not fail Run when fn returned while the lock was
// certainly held: the work was protected, and the lock, if the release did
// not delete it, expires by itself. Run used to return the release's
// network error, so the job was retried and its work done again.
func TestRunReleaseFailureAfterProtectedWorkIsNotAnError(t *testing.T) {
	_, _, c, proxy := lossyClient(t, -1, true)
	ctx := context.Background()

	ran := false
	err := c.Run(ctx, "order:15", func(ctx context.Context, l *redislock.Lock) error {
		ran = true
		proxy.dropNextReply.Store(true) // the next reply is the release's
		return nil
	})
	if proxy.dropNextReply.Load() {
		t.Fatal("no reply was dropped")
	}
	if !ran {
		t.Fatal("fn did not run")
	}
	if err != nil {
		t.Fatalf("Run = %v, want nil: fn returned while the lock was held", err)
	}
	// fn's own error still comes through unchanged.
	boom := errors.New("boom")
	err = c.Run(ctx, "order:16", func(ctx context.Context, l *redislock.Lock) error {
		proxy.dropNextReply.Store(true)
		return boom
	})
	if !errors.Is(err, boom) || errors.Is(err, redislock.ErrLockLost) {
		t.Fatalf("Run = %v, want fn's error alone", err)
	}
}

// When the reply to an extension is lost, the retried script extends the
// lock again: still ours, not lost.
func TestExtendRetriedAfterLostReplyKeepsTheLock(t *testing.T) {
	_, _, c, proxy := lossyClient(t, 3, true)
	ctx := context.Background()

	l, err := c.Obtain(ctx, "order:14")
	if err != nil {
		t.Fatal(err)
	}
	warmExtend := l.Extend(ctx) // loads the extension script
	if warmExtend != nil {
		t.Fatal(warmExtend)
	}
	proxy.dropNextReply.Store(true)
	err = l.Extend(ctx)
	if proxy.dropNextReply.Load() {
		t.Fatal("no reply was dropped")
	}
	if err != nil {
		t.Fatalf("Extend = %v, want nil", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release after Extend = %v", err)
	}
}

// warmUp loads the obtain and release scripts and puts a connection in the
// pool, so that the reply a test drops is the one of the call it makes.
// lossyClient returns the shared Redis client, the test's key prefix, a lock Client (TTL one
// minute) whose connection goes through a lossyProxy, and the proxy; the
// proxied client retries a command whose reply was lost up to maxRetries
// times (-1: never). warm obtains and releases a lock first, so that the
// scripts are loaded and the next reply dropped is the one a test means.
func lossyClient(t *testing.T, maxRetries int, warm bool) (*redis.Client, string, *redislock.Client, *lossyProxy) {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	proxy := newLossyProxy(t, integration.RedisAddr(t))
	proxied := redis.NewClient(&redis.Options{Addr: proxy.addr, MaxRetries: maxRetries})
	t.Cleanup(func() { proxied.Close() })
	c := newClient(t, proxied, prefix, redislock.Options{TTL: time.Minute})
	if warm {
		warmUp(context.Background(), t, c)
	}
	return rdb, prefix, c, proxy
}

func warmUp(ctx context.Context, t *testing.T, c *redislock.Client) {
	t.Helper()
	warm, err := c.Obtain(ctx, "warm-up")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// lossyProxy forwards TCP connections to a Redis server. When dropNextReply
// is set, the next chunk the server sends back is not passed on: the proxy
// closes that connection instead, after the server has run the command.
type lossyProxy struct {
	addr          string
	dropNextReply atomic.Bool
}

func newLossyProxy(t *testing.T, target string) *lossyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				_ = client.Close()
				continue
			}
			track(client)
			track(server)
			wg.Add(2)
			go func() { // client → server
				defer wg.Done()
				_, _ = io.Copy(server, client)
				_ = server.Close()
			}()
			go func() { // server → client, but for a dropped reply
				defer wg.Done()
				defer client.Close()
				defer server.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 {
						if p.dropNextReply.CompareAndSwap(true, false) {
							return
						}
						if _, werr := client.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

// An Obtain whose reply is lost with no retry left returns an error, but
// Redis took the lock: it was then held by nobody for a whole TTL, every
// Obtain of the resource busy meanwhile (a job about it waited a minute
// here). Obtain releases what it may have taken before returning.
func TestObtainLostReplyWithoutRetryLeavesNoLock(t *testing.T) {
	rdb, prefix, c, proxy := lossyClient(t, -1, true)
	ctx := context.Background()
	proxy.dropNextReply.Store(true)
	if _, err := c.Obtain(ctx, "order:17"); err == nil {
		t.Fatal("Obtain with its reply dropped and no retry succeeded")
	}
	if proxy.dropNextReply.Load() {
		t.Fatal("no reply was dropped")
	}
	if n, err := rdb.Exists(ctx, prefix+"{order:17}").Result(); err != nil || n != 0 {
		t.Fatalf("the lock the failed Obtain took is still there (%d, %v)", n, err)
	}
	l, err := c.Obtain(ctx, "order:17")
	if err != nil {
		t.Fatalf("the next Obtain = %v, want the lock", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A handler that releases its lock early gives up the lock's protection for
// the rest of its work: Run then reports ErrLockLost (its own release is a
// second one). When the early release's reply was lost, with no retry, the
// handler got a network error although Redis had released the lock; Run's
// own release then found the release marker and answered as if it had
// released the lock itself, and Run returned nil: work partly done without
// the lock reported protected. It reports ErrLockLost either way.
func TestRunEarlyReleaseWithLostReplyIsNotProtected(t *testing.T) {
	rdb, prefix, c, proxy := lossyClient(t, -1, true)
	ctx := context.Background()

	// Without a lost reply.
	err := c.Run(ctx, "order:18", func(ctx context.Context, l *redislock.Lock) error {
		if err := l.Release(ctx); err != nil {
			t.Errorf("early Release = %v", err)
		}
		return nil
	})
	if !errors.Is(err, redislock.ErrLockLost) {
		t.Fatalf("Run after an early release = %v, want ErrLockLost", err)
	}

	// With the early release's reply lost.
	var relErr error
	err = c.Run(ctx, "order:19", func(ctx context.Context, l *redislock.Lock) error {
		proxy.dropNextReply.Store(true) // the next reply is the early release's
		relErr = l.Release(ctx)
		if n, err := rdb.Exists(ctx, prefix+"{order:19}").Result(); err != nil || n != 0 {
			t.Errorf("lock still there after the early release ran (%d, %v)", n, err)
		}
		return nil // the rest of the work runs without the lock
	})
	if proxy.dropNextReply.Load() {
		t.Fatal("no reply was dropped")
	}
	if relErr == nil || errors.Is(relErr, redislock.ErrLockLost) {
		t.Fatalf("early Release with its reply lost = %v, want a network error", relErr)
	}
	if !errors.Is(err, redislock.ErrLockLost) {
		t.Fatalf("Run after an early release whose reply was lost = %v, want ErrLockLost as without the loss", err)
	}
}
