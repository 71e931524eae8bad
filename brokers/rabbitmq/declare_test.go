package rabbitmq

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Concurrent first uses of a queue name run one declaration and share its
// outcome: a caller never goes ahead (and publishes) while another's
// declaration of the same queue is in flight, because a quorum queue whose
// creation fails is deleted with what was published to it meanwhile.
func TestDeclareSharedOneAtATime(t *testing.T) {
	b := &Broker{declared: map[string]bool{}, declaring: map[string]*declareCall{}}
	var calls, entered, callers atomic.Int32
	var result atomic.Pointer[error]
	declare := func(ctx context.Context, name string) error {
		calls.Add(1)
		// The other callers arrive meanwhile: wait until every one has
		// started (a goroutine not yet scheduled when the declaration ended
		// would rightly start its own), then give them time to queue.
		for deadline := time.Now().Add(10 * time.Second); entered.Load() < callers.Load() && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		return *result.Load()
	}
	run := func(n int) []error {
		errs := make([]error, n)
		entered.Store(0)
		callers.Store(int32(n))
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() {
				entered.Add(1)
				errs[i] = b.declareShared(t.Context(), "q", false, declare)
			})
		}
		wg.Wait()
		return errs
	}
	failed := errors.New("cluster_not_formed")
	result.Store(&failed)
	for i, err := range run(8) {
		if !errors.Is(err, failed) {
			t.Errorf("caller %d: %v, want the declaration's failure", i, err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d declarations for 8 concurrent callers, want 1", n)
	}
	if b.declared["q"] {
		t.Fatal("a failed declaration recorded as done")
	}
	var ok error
	result.Store(&ok)
	calls.Store(0)
	for i, err := range run(8) {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d declarations after the failure, want 1", n)
	}
	if err := b.declareShared(t.Context(), "q", false, declare); err != nil || calls.Load() != 1 {
		t.Fatalf("declared queue declared again (%d calls, %v)", calls.Load(), err)
	}
}
