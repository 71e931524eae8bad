package jetstream_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestCloseMidDeclareReleasesLock: a Broker that owns its connection is
// closed while one of its declarations holds the queue's declaration lock.
// Close closed the connection under the declaration, whose release of the
// lock then failed: the lock stream stayed, and every other Broker that
// declared the queue waited declareLockTTL (30 s) to break it. Close must
// let the declaration end and release the lock before it closes the
// connection.
func TestCloseMidDeclareReleasesLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	q := "closelock-" + suffix()
	t.Cleanup(func() { deleteQueue(t, q) })
	b1 := newBroker(t, jetstream.Options{Logger: quiet})
	stream, _ := b1.StreamNames(q)
	lockName := strings.Replace(stream, "_Q_", "_LOCK_", 1)

	held, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	restore := jetstream.SetDeclareLockHook(func(name string, isHeld bool) {
		if name != lockName || !isHeld {
			return
		}
		once.Do(func() { close(held) })
		<-proceed
	})
	defer restore()

	declErr := make(chan error, 1)
	go func() { declErr <- b1.DeclareQueue(ctx, q) }()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the declaration never took the lock")
	}
	closed := make(chan struct{})
	go func() {
		_ = b1.Close()
		close(closed)
	}()
	select { // Close may wait for the declaration (it should), or not
	case <-closed:
	case <-time.After(300 * time.Millisecond):
	}
	close(proceed)
	<-closed
	if err := <-declErr; err != nil && !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("DeclareQueue during Close: %v", err)
	}

	if n, err := lockMsgs(ctx, t, lockName); err != nil || n != 0 {
		t.Errorf("lock %s after Close mid-declare: %d messages (err %v), want it released", lockName, n, err)
	}
	b2 := newBroker(t, jetstream.Options{Logger: quiet})
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	start := time.Now()
	if err := b2.DeclareQueue(dctx, q); err != nil {
		t.Errorf("another Broker's DeclareQueue after a Close mid-declare: %v (after %s)", err, time.Since(start).Round(time.Millisecond))
	}
}

// TestDeclareLockCreateLostReplyReleases: a declaration's ctx ends while
// its take of the queue's lock is under way, and the server applies it
// (its answer lost or late). The declaration did not know it held the lock
// and left it: every other Broker that declared the queue waited
// declareLockTTL (30 s) for it. A declaration whose take of the lock
// failed must release the lock when it turns out to be its own.
func TestDeclareLockCreateLostReplyReleases(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	q := "lostlock-" + suffix()
	t.Cleanup(func() { deleteQueue(t, q) })
	u, p := integration.ProxyURL(t, integration.NATSURL(t))
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	b1, err := jetstream.Connect(cctx, u.String(), jetstream.ConnectOptions{Name: "berth-test-lostlock"}, jetstream.Options{Logger: quiet})
	ccancel()
	if err != nil {
		t.Fatal(err)
	}
	defer b1.Close()
	stream, _ := b1.StreamNames(q)
	lockName := strings.Replace(stream, "_Q_", "_LOCK_", 1)

	var once sync.Once
	restore := jetstream.SetDeclareLockHook(func(name string, isHeld bool) {
		if name != lockName || isHeld {
			return
		}
		once.Do(func() {
			p.FreezeReplies() // the create reaches the server; its answer does not come back in time
			time.AfterFunc(1500*time.Millisecond, p.Thaw)
		})
	})
	defer restore()

	dctx, dcancel := context.WithTimeout(ctx, time.Second)
	err = b1.DeclareQueue(dctx, q)
	dcancel()
	if err == nil {
		t.Fatal("DeclareQueue succeeded with its lock create's answer held past its ctx")
	}
	restore()
	time.Sleep(2 * time.Second) // thawed: nothing of b1's is still on its way

	if n, err := lockMsgs(ctx, t, lockName); err != nil || n != 0 {
		t.Errorf("lock %s after a declaration whose take of it timed out: %d messages (err %v), want it released", lockName, n, err)
	}
	b2 := newBroker(t, jetstream.Options{Logger: quiet})
	d2ctx, d2cancel := context.WithTimeout(ctx, 5*time.Second)
	defer d2cancel()
	start := time.Now()
	if err := b2.DeclareQueue(d2ctx, q); err != nil {
		t.Errorf("another Broker's DeclareQueue: %v (after %s)", err, time.Since(start).Round(time.Millisecond))
	}
}

// TestDeclareLockClockAheadKeepsLiveLock: a Broker declares a queue while
// another declaration holds its lock. One whose clock ran a minute ahead of
// the server's compared the lock stream's creation time (the server's
// clock) with its own clock, found the live lock older than declareLockTTL
// and broke it: two declarations held the lock at once. The age of a lock
// is now the server's alone (the lock stream's MaxAge), and no client
// clock is read: the second declaration must wait.
func TestDeclareLockClockAheadKeepsLiveLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	q := "skewlock-" + suffix()
	t.Cleanup(func() { deleteQueue(t, q) })
	b1 := newBroker(t, jetstream.Options{Logger: quiet})
	b2 := newBroker(t, jetstream.Options{Logger: quiet})
	stream, _ := b1.StreamNames(q)
	lockName := strings.Replace(stream, "_Q_", "_LOCK_", 1)

	held, proceed := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	var holders atomic.Int32
	restore := jetstream.SetDeclareLockHook(func(name string, isHeld bool) {
		if name != lockName || !isHeld {
			return
		}
		if n := holders.Add(1); n > 1 {
			t.Errorf("%d declarations hold the lock of %s at once", n, q)
		}
		if first.CompareAndSwap(false, true) {
			close(held)
			<-proceed
		}
		holders.Add(-1)
	})
	defer restore()

	decl1 := make(chan error, 1)
	go func() { decl1 <- b1.DeclareQueue(ctx, q) }()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the first declaration never took the lock")
	}
	d2ctx, d2cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	err := b2.DeclareQueue(d2ctx, q)
	d2cancel()
	if err == nil {
		t.Errorf("a second declaration completed while the first held the lock")
	}
	close(proceed)
	if err := <-decl1; err != nil {
		t.Errorf("first DeclareQueue: %v", err)
	}
	if err := b2.DeclareQueue(ctx, q); err != nil {
		t.Errorf("second DeclareQueue once the lock is released: %v", err)
	}
}

// lockMsgs returns how many messages the lock stream lockName stores: 0
// when it is free (or absent), 1 while a declaration holds it.
func lockMsgs(ctx context.Context, t *testing.T, lockName string) (uint64, error) {
	s, err := rawJetStream(t).Stream(ctx, lockName)
	if errors.Is(err, njs.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().State.Msgs, nil
}
