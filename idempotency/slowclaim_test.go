package idempotency_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
)

// slowClaim is a store whose claims answer late: the claim is stored at
// once, its answer arrives after delay (a reply held up on the network, a
// statement whose commit waits on a slow disk).
type slowClaim struct {
	*memstore.Store
	delay  time.Duration
	slow   atomic.Bool
	expiry time.Time // of the slow claim, as stored
}

func (s *slowClaim) Claim(ctx context.Context, c idempotency.Claim) (idempotency.Outcome, *idempotency.Record, error) {
	out, rec, err := s.Store.Claim(ctx, c)
	if s.slow.CompareAndSwap(true, false) {
		if stored, err := s.Store.Get(ctx, c.Key); err == nil {
			s.expiry = stored.LockedUntil
		}
		time.Sleep(s.delay)
	}
	return out, rec, err
}

// TestSlowClaimAnswerExtendedInTime: the heartbeat counts the claim from
// when it was taken, not from when its answer arrived. It extended the
// claim first one Heartbeat after the handler started: a claim that took
// longer than ClaimLease − Heartbeat to answer expired under the running
// handler before any extension, and another worker took the key over and
// ran the operation beside it.
func TestSlowClaimAnswerExtendedInTime(t *testing.T) {
	const (
		lease = 3 * time.Second
		beat  = time.Second
	)
	store := &slowClaim{Store: memstore.New(memstore.Options{}), delay: lease - beat*6/10}
	opts := idempotency.Options{Store: store, Mode: idempotency.Lease, ClaimLease: lease, Heartbeat: beat, Logger: quiet}
	g1, err := idempotency.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := idempotency.New(opts) // another worker
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "k-slow-claim", JobType: "t", Fingerprint: "fp"}
	var running atomic.Bool
	started, finish := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	store.slow.Store(true)
	go func() {
		_, err := g1.Do(context.Background(), op, func(ctx context.Context) error {
			running.Store(true)
			defer running.Store(false)
			close(started)
			select {
			case <-finish:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})
		first <- err
	}()
	<-started
	if store.expiry.IsZero() {
		t.Fatal("the slow claim was not stored")
	}
	// Past the expiry the claim was taken with, a redelivery comes.
	time.Sleep(time.Until(store.expiry) + beat/4)
	overlapped := false
	ran, err := g2.Do(context.Background(), op, func(context.Context) error {
		overlapped = running.Load()
		return nil
	})
	close(finish)
	err1 := <-first
	if overlapped {
		t.Fatalf("the redelivery took the key over and ran beside the first handler (ran=%v, err=%v; first: %v)", ran, err, err1)
	}
	if ran || !errors.Is(err, idempotency.ErrInProgress) {
		t.Errorf("redelivery: ran=%v err=%v; want ErrInProgress", ran, err)
	}
	if err1 != nil {
		t.Errorf("first Do = %v, want nil", err1)
	}
}
