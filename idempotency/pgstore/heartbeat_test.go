package pgstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
)

// A worker whose pool its handler has exhausted cannot extend its claim: the
// heartbeat's extension waits for a connection. It must give up before the
// claim runs out and cancel the handler with ErrClaimLost, so that the
// worker that takes the key over never runs beside it.
func TestPoolStarvedHeartbeatCancelsHandler(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	small, s1 := oneConnStore(t, e)
	const lease = time.Second
	opts := idempotency.Options{Mode: idempotency.Lease, ClaimLease: lease, Heartbeat: 200 * time.Millisecond, Logger: quiet}
	opts.Store = s1
	g1, err := idempotency.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.Store = e.store
	g2, err := idempotency.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "k-" + randSuffix(), JobType: "t", Fingerprint: "fp"}
	var running, overlapped atomic.Bool
	cause := make(chan error, 1)
	first := make(chan error, 1)
	// Bounded, so that a heartbeat that never gives up fails the test
	// rather than hanging it.
	dctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	go func() {
		_, err := g1.Do(dctx, op, func(hctx context.Context) error {
			running.Store(true)
			defer running.Store(false)
			conn, err := small.Acquire(hctx) // the handler's own work holds the pool's only connection
			if err != nil {
				return err
			}
			defer conn.Release()
			<-hctx.Done()
			cause <- context.Cause(hctx)
			return context.Cause(hctx)
		})
		first <- err
	}()
	if c := <-cause; !errors.Is(c, idempotency.ErrClaimLost) {
		t.Fatalf("handler's context cause = %v, want ErrClaimLost", c)
	}
	if err := <-first; !errors.Is(err, idempotency.ErrClaimLost) {
		t.Errorf("first worker's Do = %v, want ErrClaimLost", err)
	}
	// Once the claim has run out, the second worker takes the key over.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ran, err := g2.Do(ctx, op, func(context.Context) error {
			overlapped.Store(running.Load())
			return nil
		})
		if err == nil && ran {
			break
		}
		if !errors.Is(err, idempotency.ErrInProgress) || time.Now().After(deadline) {
			t.Fatalf("second worker: ran=%v err=%v", ran, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if overlapped.Load() {
		t.Error("the second worker ran the operation while the first worker's handler still ran")
	}
}

// Result JSON that is not JSON (an external API's error page kept as the
// result) is refused by SetResult; the effect is recorded once, not left
// to a redelivery that would apply it again when PostgreSQL refused the
// completion.
func TestInvalidResultJSONDoesNotReapplyEffect(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	g, err := idempotency.New(idempotency.Options{Store: e.store, Mode: idempotency.Lease, ClaimLease: 300 * time.Millisecond,
		Heartbeat: 100 * time.Millisecond, CleanupTimeout: 100 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "k-" + randSuffix(), JobType: "t", Fingerprint: "fp"}
	effects := 0
	for range 3 {
		if _, err := g.Do(ctx, op, func(hctx context.Context) error {
			effects++ // the charge
			if idempotency.SetResult(hctx, idempotency.Result{JSON: []byte("<html>ok</html>")}) {
				t.Error("SetResult accepted invalid JSON")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(400 * time.Millisecond) // past the claim, as a redelivery's backoff
	}
	if effects != 1 {
		t.Errorf("effect applied %d times, want 1", effects)
	}
}
