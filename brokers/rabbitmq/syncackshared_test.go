package rabbitmq

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestSyncAckSharedFlushFails: with SyncAck, two Acks that wait while
// another flush runs have their tags sent by whichever flush runs next.
// When that flush's frame fails (the channel closed under it), the Ack
// whose tag it carried but which did not run it must fail too: its flush
// finds nothing left to send on a dead channel. Before, it returned nil:
// an ack reported written although it never left, and the message came
// back.
func TestSyncAckSharedFlushFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := serverURL(t)
	q := testQueue(t, url)
	b := newBroker(t, url, Options{SyncAck: true})
	release := make(chan struct{})
	var calls atomic.Int32
	var st atomic.Pointer[chanState]
	b.ackHook = func(tag uint64, multiple bool) {
		switch calls.Add(1) {
		case 1: // the first Ack's flush, holding flushMu
			<-release
		case 2: // the flush that carries the two waiting acks: its channel dies now
			_ = st.Load().ch.Close()
		}
	}
	publishN(t, ctx, b, q, "t", 3)
	ds := receiveAll(t, ctx, b, q, 3)
	st.Store(ds[0].st)
	first := make(chan error, 1)
	go func() { first <- ds[0].Ack(ctx) }()
	for calls.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, d := range ds[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.Ack(ctx)
		}()
	}
	for { // both waiting acks recorded, their flushes waiting for flushMu
		ds[0].st.mu.Lock()
		n := len(ds[0].st.acked)
		ds[0].st.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first Ack: %v", err)
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, sdk.ErrLeaseLost) {
			t.Errorf("Ack of delivery %d, whose frame failed: %v, want ErrLeaseLost", i+2, err)
		}
	}
}
