package pgstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestCompletionOutlastsStoreOutage: a lease-mode handler applied its
// effect (the charge) and returned nil, and the store is then out of reach
// of its worker for longer than CleanupTimeout but far less than the claim
// (a failover, a starved pool: here the pool's only connection is taken).
// The claim still holds — no other worker can take the key over — so the
// guard goes on recording the success until the store answers, and the
// redelivery finds the key completed. Before, the guard gave up after
// CleanupTimeout and left the claim in progress; once it expired, the
// redelivery took the key over and applied the effect a second time.
func TestCompletionOutlastsStoreOutage(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	small, s1 := oneConnStore(t, e)
	const (
		lease   = 10 * time.Second
		cleanup = 200 * time.Millisecond
		outage  = 10 * cleanup // well past CleanupTimeout, well within the claim
	)
	opts := idempotency.Options{Mode: idempotency.Lease, ClaimLease: lease, CleanupTimeout: cleanup, Logger: quiet}
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
	var effects atomic.Int32
	taken := make(chan *pgxpool.Conn, 1)
	first := make(chan error, 1)
	go func() {
		_, err := g1.Do(ctx, op, func(hctx context.Context) error {
			effects.Add(1) // the external effect
			// The store goes out of reach right after it.
			conn, err := small.Acquire(hctx)
			if err != nil {
				return err
			}
			taken <- conn
			return nil
		})
		first <- err
	}()
	conn := <-taken
	var firstErr error
	gotFirst := false
	select {
	case firstErr = <-first: // gave up recording the success during the outage
		gotFirst = true
	case <-time.After(outage):
	}
	conn.Release() // the outage ends
	// The redelivery, on another worker, retries until the key is settled.
	deadline := time.Now().Add(2*lease + 30*time.Second)
	for {
		_, err := g2.Do(ctx, op, func(context.Context) error {
			effects.Add(1)
			return nil
		})
		if err == nil {
			break
		}
		if !errors.Is(err, idempotency.ErrInProgress) || time.Now().After(deadline) {
			t.Fatalf("second worker: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !gotFirst {
		firstErr = <-first
	}
	if firstErr != nil {
		t.Errorf("first worker's Do = %v, want nil: its success recorded once the store answered", firstErr)
	}
	if n := effects.Load(); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
}

// TestCompletionAfterShutdownKeepsCleanupTimeout: once the handler's ctx is
// done (the Worker's drain deadline passed), the completion retried during
// a store outage stops after CleanupTimeout, as before it could outlive
// it: the Worker gives up on a handler that outlasts its drain, and a
// shutdown must not wait for the rest of a 10 s claim. (The review of the
// change above found it waited the whole claim.)
func TestCompletionAfterShutdownKeepsCleanupTimeout(t *testing.T) {
	e := newEnv(t)
	small, s1 := oneConnStore(t, e)
	const (
		lease   = 60 * time.Second
		cleanup = 200 * time.Millisecond
	)
	g, err := idempotency.New(idempotency.Options{Mode: idempotency.Lease, Store: s1, ClaimLease: lease, CleanupTimeout: cleanup, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "k-" + randSuffix(), JobType: "t", Fingerprint: "fp"}
	ctx, shutdown := context.WithCancel(context.Background())
	var conn *pgxpool.Conn
	start := time.Now()
	_, err = g.Do(ctx, op, func(hctx context.Context) error {
		// The store goes out of reach, and the shutdown comes, right after
		// the effect.
		c, err := small.Acquire(hctx)
		if err != nil {
			return err
		}
		conn = c
		shutdown()
		return nil
	})
	took := time.Since(start)
	if conn != nil {
		conn.Release()
	}
	if err == nil {
		t.Fatal("Do recorded the success with the store out of reach")
	}
	if took > lease/2 {
		t.Errorf("Do returned after %s: the completion after the shutdown outlived CleanupTimeout (%s) by far, toward the claim's %s", took, cleanup, lease)
	}
}
