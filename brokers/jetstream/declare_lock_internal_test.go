package jetstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/integration"
)

// TestStaleDeclareLockBroken: a declaration lock left by a holder that
// died is broken once it is declareLockTTL old on the server's clock (here
// shortened), and the declaration that waited for it goes on; one younger
// than that, on the server's clock, is not broken even when the local
// clock says it is older.
func TestStaleDeclareLockBroken(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b, err := Connect(ctx, integration.NATSURL(t), ConnectOptions{Name: "berth-test-stalelock"},
		Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var sfx [6]byte
	_, _ = rand.Read(sfx[:])
	queue := "stalelock-" + hex.EncodeToString(sfx[:])
	defer func() { _ = b.DeleteQueue(context.Background(), queue) }()
	q := b.names(queue)

	oldTTL, oldClock := declareLockTTL, lockClock
	defer func() { declareLockTTL, lockClock = oldTTL, oldClock }()
	declareLockTTL = 2 * time.Second

	dead := &declareLock{b: b, stream: q.lock, subject: q.lockSubject, token: "dead"}
	if err := dead.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	// Its holder dies: never released. Young on the server's clock, old
	// on a clock running ahead: it stays.
	lockClock = func() time.Time { return time.Now().Add(time.Minute) }
	wctx, wcancel := context.WithTimeout(ctx, 700*time.Millisecond)
	waiter := &declareLock{b: b, stream: q.lock, subject: q.lockSubject, token: "waiter"}
	err = waiter.acquire(wctx)
	wcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire of a young lock (on the server's clock): %v, want it to wait until its ctx ends", err)
	}
	lockClock = time.Now
	start := time.Now()
	if err := waiter.acquire(ctx); err != nil {
		t.Fatalf("acquire of a stale lock: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("stale lock broken after %s", el)
	}
	s, err := b.js.Stream(ctx, q.lock)
	if err != nil {
		t.Fatal(err)
	}
	if d := s.CachedInfo().Config.Description; d != waiter.config().Description {
		t.Errorf("lock description %q, want the waiter's", d)
	}
	waiter.release(ctx)
	if _, err := b.js.Stream(ctx, q.lock); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("lock after release: %v, want it deleted", err)
	}
}
