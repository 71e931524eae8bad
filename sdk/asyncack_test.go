package sdk_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// asyncDelivery is a delivery whose acks finish when the test says so.
type asyncDelivery struct {
	*berthtest.Delivery
	acks chan func(error) // the done of each AckAsync, in call order
}

func (d *asyncDelivery) AckAsync(_ context.Context, done func(error)) { d.acks <- done }

// TestWorkerAsyncAck: a successful job of an AsyncAcker delivery is acked in
// the background; the handler goroutine moves on, the delivery keeps its slot
// until the ack is back, observers see the ack's own outcome (a lost lease
// included), and Run does not return before pending acks are back.
func TestWorkerAsyncAck(t *testing.T) {
	sub := newFakeSub()
	acks := make(chan func(error), 16)
	var handled atomic.Int32
	rec := berthtest.NewRecorder()
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { handled.Add(1); return nil })
	// Concurrency 1, Prefetch 1: two slots.
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Prefetch: 1, Observers: []sdk.Observer{rec}})
	ds := make([]*asyncDelivery, 4)
	for i := range ds {
		ds[i] = &asyncDelivery{Delivery: newFake(1, "t"), acks: acks}
		sub.ch <- ds[i]
	}
	timeout := time.After(berthtest.WaitTimeout)
	next := func() func(error) {
		t.Helper()
		select {
		case done := <-acks:
			return done
		case <-timeout:
			t.Fatal("no AckAsync")
			return nil
		}
	}
	// One handler goroutine: the second job ran while the first ack was
	// pending, so the handler did not wait for it.
	ack1, ack2 := next(), next()
	if got := handled.Load(); got != 2 {
		t.Fatalf("handled %d, want 2", got)
	}
	// Both slots are held by pending acks: nothing else is received or run.
	time.Sleep(50 * time.Millisecond)
	if got := handled.Load(); got != 2 {
		t.Fatalf("handled %d with both slots held by pending acks, want 2", got)
	}
	if n := len(rec.Records()); n != 0 {
		t.Fatalf("%d settlements reported before any ack was back", n)
	}
	ack1(sdk.ErrLeaseLost) // the lease was lost before the batch was written
	rs := rec.Wait(t, 1)
	if rs[0].Action != sdk.ActionAck || !errors.Is(rs[0].Err, sdk.ErrLeaseLost) || rs[0].Message != ds[0].Message() {
		t.Fatalf("first settlement = %+v, want the first job's ack with ErrLeaseLost", rs[0])
	}
	ack3 := next() // its slot freed, the third job ran
	ack2(nil)
	ack3(nil)
	ack4 := next()
	rec.Wait(t, 3)

	// Run waits for the pending ack before returning.
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-stopped:
		t.Fatalf("Run returned (%v) with an ack pending", err)
	default:
	}
	ack4(nil)
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(berthtest.WaitTimeout):
		t.Fatal("Run did not return after the last ack")
	}
	rs = rec.Records()
	if len(rs) != 4 {
		t.Fatalf("%d settlements, want 4", len(rs))
	}
	for _, r := range rs[1:] {
		if r.Action != sdk.ActionAck || r.Err != nil {
			t.Errorf("settlement %+v, want a clean ack", r)
		}
	}
	for _, d := range ds {
		if calls := d.Calls(); len(calls) != 0 {
			t.Errorf("synchronous settlement calls %v on an AsyncAcker delivery", calls)
		}
	}
}

// maxSub records the max of every Receive.
type maxSub struct {
	*fakeSub
	mu   sync.Mutex
	maxs []int
}

func (s *maxSub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	s.mu.Lock()
	s.maxs = append(s.maxs, max)
	s.mu.Unlock()
	return s.fakeSub.Receive(ctx, queue, max)
}

func (s *maxSub) calls() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.maxs...)
}

// TestWorkerWaitsForAckBatch: while acks are under way, the slots they hold
// come back together when their batch is written, so the Worker does not
// claim one job per slot as each ack returns: it waits until half its slots
// are free, as it does while prefetched work waits.
func TestWorkerWaitsForAckBatch(t *testing.T) {
	sub := &maxSub{fakeSub: newFakeSub()}
	acks := make(chan func(error), 16)
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	// All eight are queued before the Worker starts, so its first Receive
	// takes them together. Sent after it starts, a Receive could take five,
	// and the Worker would rightly wait with three slots free for acks the
	// test completes only once all eight have started.
	for range 8 {
		sub.ch <- &asyncDelivery{Delivery: newFake(1, "t"), acks: acks}
	}
	// Concurrency 4, Prefetch 4: eight slots, half is four.
	runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 4, Prefetch: 4})
	dones := make([]func(error), 0, 8)
	timeout := time.After(berthtest.WaitTimeout)
	for len(dones) < 8 {
		select {
		case d := <-acks:
			dones = append(dones, d)
		case <-timeout:
			t.Fatalf("%d acks started, want 8", len(dones))
		}
	}
	before := len(sub.calls())
	for _, d := range dones[:3] { // three slots back, five acks still under way
		d(nil)
	}
	time.Sleep(50 * time.Millisecond)
	if got := sub.calls()[before:]; len(got) > 0 {
		t.Fatalf("Receive(max %v) with acks under way and fewer than half the slots free", got)
	}
	dones[3](nil) // half free
	deadline := time.After(berthtest.WaitTimeout)
	for len(sub.calls()) == before {
		select {
		case <-deadline:
			t.Fatal("no Receive once half the slots were free")
		case <-time.After(time.Millisecond):
		}
	}
	if got := sub.calls()[before]; got < 4 {
		t.Errorf("Receive(max %d) once half the slots were free, want at least 4", got)
	}
	for _, d := range dones[4:] {
		d(nil)
	}
}

// TestWorkerAsyncAckKeepsLease: the heartbeat goes on extending the lease of
// a job whose handler returned while its background ack is under way, and
// stops once the ack is back. Before, it left the job alone as soon as the
// handler returned: an ack slower than the lease let the lease lapse, and
// another consumer ran the job again.
func TestWorkerAsyncAckKeepsLease(t *testing.T) {
	sub := newFakeSub()
	acks := make(chan func(error), 1)
	var extends atomic.Int32
	rec := berthtest.NewRecorder()
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Lease: 80 * time.Millisecond,
		HeartbeatInterval: 10 * time.Millisecond, Observers: []sdk.Observer{rec}})
	d := &asyncDelivery{Delivery: newFake(1, "t", berthtest.OnExtend(func(context.Context, time.Duration) error {
		extends.Add(1)
		return nil
	})), acks: acks}
	sub.ch <- d
	var ack func(error)
	select {
	case ack = <-acks:
	case <-time.After(berthtest.WaitTimeout):
		t.Fatal("no AckAsync")
	}
	before := extends.Load()
	time.Sleep(200 * time.Millisecond) // 2.5 leases
	if got := extends.Load() - before; got < 3 {
		t.Fatalf("%d lease extensions while the ack was under way for 2.5 leases, want several", got)
	}
	ack(nil)
	rs := rec.Wait(t, 1)
	if rs[0].Action != sdk.ActionAck || rs[0].Err != nil {
		t.Fatalf("settlement = %+v, want an ack", rs[0])
	}
	after := extends.Load()
	time.Sleep(50 * time.Millisecond)
	if got := extends.Load() - after; got > 1 { // one may have been under way as the ack came back
		t.Errorf("%d lease extensions after the ack was back, want none", got)
	}
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// ctxObserver records, at each Settled, whether its context had ended.
type ctxObserver struct {
	ended chan error // ctx.Err() at each Settled
}

func (o *ctxObserver) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }
func (o *ctxObserver) Settled(ctx context.Context, _ sdk.Delivery, _ sdk.Settlement) {
	o.ended <- ctx.Err()
}

// TestWorkerAsyncAckLeaseLostKeepsContext: an extension that finds the lease
// lost while the background ack is under way stops the extensions, but does
// not cancel the handler's context (the handler has returned): the
// observers get the ack's outcome with the context they gave the handler,
// as after any ack, not one already cancelled by the heartbeat.
func TestWorkerAsyncAckLeaseLostKeepsContext(t *testing.T) {
	sub := newFakeSub()
	acks := make(chan func(error), 1)
	var extends atomic.Int32
	obs := &ctxObserver{ended: make(chan error, 1)}
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	stop := runWorker(t, sub, h, sdk.WorkerOptions{Concurrency: 1, Lease: 80 * time.Millisecond,
		HeartbeatInterval: 10 * time.Millisecond, Observers: []sdk.Observer{obs}})
	d := &asyncDelivery{Delivery: newFake(1, "t", berthtest.OnExtend(func(context.Context, time.Duration) error {
		extends.Add(1)
		return sdk.ErrLeaseLost
	})), acks: acks}
	sub.ch <- d
	var ack func(error)
	select {
	case ack = <-acks:
	case <-time.After(berthtest.WaitTimeout):
		t.Fatal("no AckAsync")
	}
	deadline := time.Now().Add(berthtest.WaitTimeout)
	for extends.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no extension while the ack was under way")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // many heartbeat periods
	if got := extends.Load(); got != 1 {
		t.Errorf("%d extensions, want 1: the lease was found lost", got)
	}
	ack(errAckLeaseLost)
	select {
	case err := <-obs.ended:
		if err != nil {
			t.Errorf("Settled got a context already ended (%v): the heartbeat cancelled it", err)
		}
	case <-time.After(berthtest.WaitTimeout):
		t.Fatal("no settlement")
	}
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// errAckLeaseLost is the error a fenced ack returns after the lease was lost.
var errAckLeaseLost = errors.Join(errors.New("ack refused"), sdk.ErrLeaseLost)
