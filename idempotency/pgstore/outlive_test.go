package pgstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
)

// A lease-mode handler whose ctx ends (shutdown, a lost delivery lease, a job
// timeout) may go on for a while — an external call in flight on its own
// context — and return nil: the guard records that success. The claim must
// not expire under it meanwhile, or the redelivery on another worker takes
// the key over and applies the effect beside it. The heartbeat used to stop
// with the handler's ctx.
func TestClaimHeldWhileHandlerOutlivesItsContext(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	opts := idempotency.Options{Store: e.store, Mode: idempotency.Lease, ClaimLease: 600 * time.Millisecond,
		Heartbeat: 150 * time.Millisecond, Logger: quiet}
	g1, err := idempotency.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := idempotency.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "k-" + randSuffix(), JobType: "t", Fingerprint: "fp"}
	var running, overlapped atomic.Bool
	var effects atomic.Int32
	ctx1, cancel1 := context.WithCancel(ctx)
	defer cancel1()
	started := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := g1.Do(ctx1, op, func(hctx context.Context) error {
			running.Store(true)
			defer running.Store(false)
			effects.Add(1)
			close(started)
			<-hctx.Done()
			time.Sleep(2 * time.Second) // the charge's HTTP call, still in flight
			return nil
		})
		first <- err
	}()
	<-started
	cancel1()
	// The redelivery, on another worker, retries until the key is settled.
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := g2.Do(ctx, op, func(context.Context) error {
			overlapped.Store(running.Load())
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
	if err := <-first; err != nil {
		t.Errorf("first worker's Do = %v, want nil (its success recorded)", err)
	}
	if overlapped.Load() {
		t.Error("the second worker ran the operation while the first worker's handler still ran")
	}
	if n := effects.Load(); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
}
