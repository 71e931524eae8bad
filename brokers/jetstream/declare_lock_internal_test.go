package jetstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/integration"
)

// TestStaleDeclareLockBroken: a declaration lock left by a holder that
// died is given up once it is declareLockTTL old on the server's clock
// (here shortened: the lock stream's MaxAge), and the declaration that
// waited for it goes on; one younger than that is not, whatever the local
// clock says (it is not read).
func TestStaleDeclareLockBroken(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b := lockTestBroker(t, ctx)
	var sfx [6]byte
	_, _ = rand.Read(sfx[:])
	queue := "stalelock-" + hex.EncodeToString(sfx[:])
	defer func() { _ = b.DeleteQueue(context.Background(), queue) }()
	q := b.names(queue)

	oldTTL := declareLockTTL
	defer func() { declareLockTTL = oldTTL }()
	declareLockTTL = 2 * time.Second

	dead := &declareLock{b: b, stream: q.lock, subject: q.lockSubject, token: "dead"}
	before := time.Now() // before the lock's message is stored: it expires no sooner than before+TTL
	if err := dead.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	// Its holder dies: never released. Young: it stays.
	wctx, wcancel := context.WithTimeout(ctx, 700*time.Millisecond)
	waiter := &declareLock{b: b, stream: q.lock, subject: q.lockSubject, token: "waiter"}
	err := waiter.acquire(wctx)
	wcancel()
	switch age := time.Since(before); {
	case err == nil && age < declareLockTTL:
		t.Fatalf("acquire took a lock %s old, younger than declareLockTTL (%s)", age, declareLockTTL)
	case err == nil:
		// The machine stalled past the TTL: the lock was stale by then,
		// and taking it was right. The young-lock check is not made.
		t.Logf("the first acquire returned after %s, past declareLockTTL: young-lock check not made", age)
	case !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("acquire of a young lock: %v, want it to wait until its ctx ends", err)
	default:
		if err := waiter.acquire(ctx); err != nil {
			t.Fatalf("acquire of a stale lock: %v", err)
		}
	}
	s, err := b.js.Stream(ctx, q.lock)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.GetLastMsgForSubject(ctx, q.lockSubject); err != nil || string(m.Data) != "waiter" {
		t.Errorf("lock holder after a takeover: %v, %v, want the waiter's", m, err)
	}
	waiter.release(ctx)
	if s, err = b.js.Stream(ctx, q.lock); err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 0 {
		t.Errorf("lock after release: %d messages, want none (free)", n)
	}
}

// TestLegacyDeclareLockConverted: the lock stream an earlier berth made
// (held while it exists, with no MaxAge) would never expire: a declaration
// that finds one converts it into the lock it takes.
func TestLegacyDeclareLockConverted(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b := lockTestBroker(t, ctx)
	var sfx [6]byte
	_, _ = rand.Read(sfx[:])
	queue := "legacylock-" + hex.EncodeToString(sfx[:])
	defer func() { _ = b.DeleteQueue(context.Background(), queue) }()
	q := b.names(queue)
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: q.lock, Description: "berth declaration lock, held by gone", Subjects: []string{q.lockSubject},
		Storage: jetstream.MemoryStorage, MaxMsgs: 1,
	}); err != nil {
		t.Fatal(err)
	}
	l := &declareLock{b: b, stream: q.lock, subject: q.lockSubject, token: "new"}
	if err := l.acquire(ctx); err != nil {
		t.Fatalf("acquire with an earlier berth's lock stream: %v", err)
	}
	l.release(ctx)
	s, err := b.js.Stream(ctx, q.lock)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; cfg.MaxAge != declareLockTTL || cfg.Description != l.config().Description {
		t.Errorf("lock stream after acquire: MaxAge %s, description %q, want converted", cfg.MaxAge, cfg.Description)
	}
}

// lockTestBroker connects a Broker for the internal lock tests, closed
// with the test.
func lockTestBroker(t *testing.T, ctx context.Context) *Broker {
	t.Helper()
	b, err := Connect(ctx, integration.NATSURL(t), ConnectOptions{Name: "berth-test-lock"},
		Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestStaleDeclareLockTakenOverOnce: many waiters, on several Brokers,
// find one stale lock (its holder died) at once. Each judged it stale,
// deleted the lock stream and created its own: one could delete the lock
// another had just created, and two held it at once. Taking over a stale
// lock must succeed for exactly one of them: at most one holder at a time.
func TestStaleDeclareLockTakenOverOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const brokers, perBroker, rounds = 3, 5, 3
	bs := make([]*Broker, brokers)
	for i := range bs {
		bs[i] = lockTestBroker(t, ctx)
	}
	var sfx [6]byte
	_, _ = rand.Read(sfx[:])
	queue := "lockrace-" + hex.EncodeToString(sfx[:])
	defer func() { _ = bs[0].DeleteQueue(context.Background(), queue) }()
	q := bs[0].names(queue)

	oldTTL := declareLockTTL
	defer func() { declareLockTTL = oldTTL }()
	declareLockTTL = time.Second

	var overlaps, taken int32
	for round := range rounds {
		dead := &declareLock{b: bs[0], stream: q.lock, subject: q.lockSubject, token: fmt.Sprintf("dead%d", round)}
		if err := dead.acquire(ctx); err != nil {
			t.Fatal(err)
		}
		// Its holder dies (never released) and the lock goes stale.
		time.Sleep(declareLockTTL + 300*time.Millisecond)
		o, n := raceForLock(t, ctx, bs, q, perBroker, fmt.Sprintf("w%d-", round))
		overlaps, taken = overlaps+o, taken+n
	}
	if overlaps > 0 {
		t.Errorf("%d of %d acquisitions found another holder in the critical section (a stale lock taken over by more than one waiter)", overlaps, taken)
	}
}

// raceForLock starts perBroker waiters on each of bs at once, each taking
// q's lock, holding it for a short critical section and releasing it, and
// returns how many found another holder in the critical section (overlaps)
// out of how many took it.
func raceForLock(t *testing.T, ctx context.Context, bs []*Broker, q *queueState, perBroker int, tokenPrefix string) (overlaps, taken int32) {
	t.Helper()
	var holders, over, took atomic.Int32
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range len(bs) * perBroker {
		l := &declareLock{b: bs[i%len(bs)], stream: q.lock, subject: q.lockSubject, token: fmt.Sprintf("%s%d", tokenPrefix, i)}
		wg.Go(func() {
			<-start
			if err := l.acquire(ctx); err != nil {
				t.Errorf("%s: acquire: %v", l.token, err)
				return
			}
			took.Add(1)
			if n := holders.Add(1); n > 1 {
				over.Add(1)
			}
			time.Sleep(5 * time.Millisecond) // the critical section
			holders.Add(-1)
			l.release(ctx)
		})
	}
	close(start)
	wg.Wait()
	return over.Load(), took.Load()
}

// lockFaultJS refuses every write that takes over queue's lock (the
// delete of a stale lock stream, a publish on the lock's subject), as a
// server without the permission would, and counts them.
type lockFaultJS struct {
	jetstream.JetStream
	stream, subject string
	refused         atomic.Int64
}

var errLockRefused = errors.New("injected: permissions violation")

func (f *lockFaultJS) DeleteStream(ctx context.Context, name string) error {
	if name == f.stream {
		f.refused.Add(1)
		return errLockRefused
	}
	return f.JetStream.DeleteStream(ctx, name)
}

func (f *lockFaultJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if m.Subject == f.subject {
		f.refused.Add(1)
		return nil, errLockRefused
	}
	return f.JetStream.PublishMsg(ctx, m, opts...)
}

// TestStaleDeclareLockRefusedWaits: a waiter finds a stale lock (its
// holder died) but cannot take it over (the server refuses the write).
// acquire retried at once, with no pause: a busy loop against the server
// until its ctx ended, which it then reported without the refusal. Each
// failed takeover must be followed by the wait a held lock gets (at least
// 10 ms), and the error at the end must name the refusal.
func TestStaleDeclareLockRefusedWaits(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	holder, waiter := lockTestBroker(t, ctx), lockTestBroker(t, ctx)
	var sfx [6]byte
	_, _ = rand.Read(sfx[:])
	queue := "lockrefused-" + hex.EncodeToString(sfx[:])
	defer func() { _ = holder.DeleteQueue(context.Background(), queue) }()
	q := holder.names(queue)

	oldTTL := declareLockTTL
	defer func() { declareLockTTL = oldTTL }()
	declareLockTTL = time.Second

	dead := &declareLock{b: holder, stream: q.lock, subject: q.lockSubject, token: "dead"}
	if err := dead.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(declareLockTTL + 300*time.Millisecond) // stale
	fake := &lockFaultJS{JetStream: waiter.js, stream: q.lock, subject: q.lockSubject}
	waiter.js = fake
	const window = 3 * time.Second
	wctx, wcancel := context.WithTimeout(ctx, window)
	l := &declareLock{b: waiter, stream: q.lock, subject: q.lockSubject, token: "waiter"}
	err := l.acquire(wctx)
	wcancel()
	l.release(ctx)
	// Every refused takeover is followed by a wait of at least 10 ms: no
	// more than window/10ms of them fit in the window (a busy loop makes
	// many times that).
	t.Logf("acquire: %v", err)
	refused, most := fake.refused.Load(), int64(window/(10*time.Millisecond))+2
	if refused == 0 {
		t.Fatalf("no takeover of the stale lock was tried (err %v)", err)
	}
	if refused > most {
		t.Errorf("%d refused takeovers of a stale lock within %s, want at most %d (a wait after each)", refused, window, most)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("acquire: %v, want it to end with its ctx (context.DeadlineExceeded)", err)
	}
	if err == nil || !strings.Contains(err.Error(), errLockRefused.Error()) {
		t.Errorf("acquire: %v, want the error to name the refused takeover (%v)", err, errLockRefused)
	}

	// Under a ctx with no end near, it gives up once every attempt has
	// failed for declareLockFailFor, with the failure.
	oldFailFor := declareLockFailFor
	defer func() { declareLockFailFor = oldFailFor }()
	declareLockFailFor = 300 * time.Millisecond
	l = &declareLock{b: waiter, stream: q.lock, subject: q.lockSubject, token: "waiter2"}
	err = l.acquire(ctx)
	l.release(ctx)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), errLockRefused.Error()) {
		t.Errorf("acquire refused for longer than declareLockFailFor: %v, want it to give up with the refusal", err)
	}
}

// TestDeclareLockFirstTakeOnce: waiters on several Brokers race for a lock
// no declaration has taken yet: its stream absent (created on first need,
// its last sequence 0), or an earlier berth's lock stream that each of them
// converts. Nats-Expected-Last-Sequence 0 must hold as any other (the
// stream stores nothing since the read), and two conversions of one stream
// must not let two take it: at most one holder at a time.
func TestDeclareLockFirstTakeOnce(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			const brokers, perBroker = 3, 5
			bs := make([]*Broker, brokers)
			for i := range bs {
				bs[i] = lockTestBroker(t, ctx)
			}
			var sfx [6]byte
			_, _ = rand.Read(sfx[:])
			queue := "lockfirst-" + hex.EncodeToString(sfx[:])
			defer func() { _ = bs[0].DeleteQueue(context.Background(), queue) }()
			q := bs[0].names(queue)
			if legacy {
				if _, err := bs[0].js.CreateStream(ctx, jetstream.StreamConfig{
					Name: q.lock, Description: "berth declaration lock, held by gone", Subjects: []string{q.lockSubject},
					Storage: jetstream.MemoryStorage, MaxMsgs: 1,
				}); err != nil {
					t.Fatal(err)
				}
			}
			if overlaps, taken := raceForLock(t, ctx, bs, q, perBroker, "w"); overlaps > 0 {
				t.Errorf("%d of %d acquisitions found another holder in the critical section (a first take by more than one waiter)", overlaps, taken)
			}
		})
	}
}

// lostTakeJS stores the takes of the lock (publishes on its subject) but
// reports each failed, as when the answer is lost on its way back.
type lostTakeJS struct {
	jetstream.JetStream
	subject string
	lost    atomic.Int64
}

func (f *lostTakeJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := f.JetStream.PublishMsg(ctx, m, opts...)
	if err == nil && m.Subject == f.subject {
		f.lost.Add(1)
		return nil, nats.ErrTimeout
	}
	return ack, err
}

// TestDeclareLockLostTakeRecognised: a take of the lock is stored but its
// answer is lost (the declaration's ctx goes on). The next attempt finds
// the lock held, and must recognise its own token there and hold it,
// rather than wait declareLockTTL for its own message to expire; release
// then frees it.
func TestDeclareLockLostTakeRecognised(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b := lockTestBroker(t, ctx)
	var sfx [6]byte
	_, _ = rand.Read(sfx[:])
	queue := "locklost-" + hex.EncodeToString(sfx[:])
	defer func() { _ = b.DeleteQueue(context.Background(), queue) }()
	q := b.names(queue)
	fake := &lostTakeJS{JetStream: b.js, subject: q.lockSubject}
	b.js = fake

	// declareLockTTL (30 s) is well past this ctx: only a declaration that
	// recognises its message holds the lock within it.
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	l := &declareLock{b: b, stream: q.lock, subject: q.lockSubject, token: "mine"}
	err := l.acquire(actx)
	acancel()
	if err != nil {
		t.Fatalf("acquire after its take's answer was lost: %v (%d takes)", err, fake.lost.Load())
	}
	if n := fake.lost.Load(); n != 1 {
		t.Errorf("%d takes stored, want 1", n)
	}
	s, err := fake.JetStream.Stream(ctx, q.lock)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.GetLastMsgForSubject(ctx, q.lockSubject); err != nil || string(m.Data) != "mine" || m.Sequence != l.seq {
		t.Errorf("lock message: %v, %v; want the declaration's, at its sequence %d", m, err, l.seq)
	}
	l.release(ctx)
	if s, err = fake.JetStream.Stream(ctx, q.lock); err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 0 {
		t.Errorf("lock after release: %d messages, want none (free)", n)
	}
}

// TestDeclareLockMaybeReleaseKeepsAnothers: a declaration whose take failed
// with an unknown outcome (maybe) releases the lock at its end; when its
// take was not stored and another declaration holds the lock, the
// message there (the last one) is the other's, and must stay.
func TestDeclareLockMaybeReleaseKeepsAnothers(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b := lockTestBroker(t, ctx)
	var sfx [6]byte
	_, _ = rand.Read(sfx[:])
	queue := "lockmaybe-" + hex.EncodeToString(sfx[:])
	defer func() { _ = b.DeleteQueue(context.Background(), queue) }()
	q := b.names(queue)

	holder := &declareLock{b: b, stream: q.lock, subject: q.lockSubject, token: "holder"}
	if err := holder.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := b.js.Stream(ctx, q.lock)
	if err != nil {
		t.Fatal(err)
	}
	other := &declareLock{b: b, stream: q.lock, subject: q.lockSubject, token: "other", maybe: true, s: s}
	other.release(ctx)
	if m, err := s.GetLastMsgForSubject(ctx, q.lockSubject); err != nil || string(m.Data) != "holder" {
		t.Fatalf("lock after the release of a take that was not stored: %v, %v; want the holder's message", m, err)
	}
	holder.release(ctx)
	if s, err = b.js.Stream(ctx, q.lock); err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 0 {
		t.Errorf("lock after the holder's release: %d messages, want none (free)", n)
	}
}
