package postgres_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestExtendLeaseRacingAck: a heartbeat's ExtendLease that loses the race
// with the holder's own Ack reports ErrAlreadySettled, as it does after the
// Ack, never ErrLeaseLost — which would tell the Worker (and the lease
// metrics) that another worker took a job this one just completed.
func TestExtendLeaseRacingAck(t *testing.T) {
	pool := newPool(t, "berth-extend-race-"+suffix(), 8)
	b := newBroker(t, pool, postgres.Options{Lease: time.Minute})
	ctx := testCtx(t)
	q := "extend_race_" + suffix()
	const n = 200
	publishN(t, b, q, n)
	ds := receiveN(t, b, q, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, d := range ds {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := d.Ack(ctx); err != nil {
				t.Errorf("Ack: %v", err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := d.ExtendLease(ctx, time.Minute); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, sdk.ErrAlreadySettled) {
			t.Errorf("ExtendLease racing the holder's Ack: %v, want nil or ErrAlreadySettled", err)
		}
	}
}
