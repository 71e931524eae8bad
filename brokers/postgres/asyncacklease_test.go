package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// settledRecorder is an Observer that sends every settlement on ch.
type settledRecorder struct{ ch chan sdk.Settlement }

func (r *settledRecorder) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }
func (r *settledRecorder) Settled(_ context.Context, _ sdk.Delivery, s sdk.Settlement) {
	r.ch <- s
}

// TestWorkerKeepsLeaseWhileAsyncAckInFlight: a job whose handler succeeded
// and whose asynchronous ack is slow to be written (held here, as a lock or
// a slow disk would hold the batch) keeps its lease: the Worker's heartbeat
// goes on extending it until the ack returns. Before, the heartbeat left it
// alone once the handler returned; the lease lapsed after one Lease, another
// consumer claimed the job and ran it again, and the first ack, written
// afterwards, was refused (ErrLeaseLost).
func TestWorkerKeepsLeaseWhileAsyncAckInFlight(t *testing.T) {
	// Two seconds: the heartbeat (every Lease/3) must extend within each
	// lease on a loaded machine too; a lease of one second left it 667 ms.
	const lease = 2 * time.Second
	pool := newPool(t, "berth-asyncacklease-"+suffix(), 6)
	b := newBroker(t, pool, postgres.Options{Lease: lease, PollInterval: 50 * time.Millisecond})
	ctx := testCtx(t)
	q := "asyncacklease_" + suffix()
	publishN(t, b, q, 1)

	release := b.HoldAcks()
	defer release()
	var runs atomic.Int32
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
		runs.Add(1)
		return nil
	})
	rec := &settledRecorder{ch: make(chan sdk.Settlement, 4)}
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: q, Concurrency: 1,
		Observers: []sdk.Observer{rec}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()

	for b.PendingAcks() < 1 { // the handler returned; its ack waits for its batch
		select {
		case <-ctx.Done():
			t.Fatal("the ack never was pending")
		case <-time.After(5 * time.Millisecond):
		}
	}
	// Another consumer tries to claim the job for two leases while the
	// ack waits.
	rctx, cancel := context.WithTimeout(ctx, 2*lease)
	ds, err := b.Receive(rctx, q, 1)
	cancel()
	if len(ds) > 0 {
		t.Errorf("another consumer claimed the job (attempt %d) while its ack was under way", ds[0].Attempt())
	} else if rctx.Err() == nil {
		t.Fatalf("Receive: %v", err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times while the ack was under way, want 1", n)
	}

	release()
	select {
	case s := <-rec.ch:
		if s.Action != sdk.ActionAck || s.Err != nil {
			t.Errorf("settlement %s, err %v; want an ack that succeeded", s.Action, s.Err)
		}
	case <-ctx.Done():
		t.Fatal("no settlement reported")
	}
	var status string
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT status, attempt_count FROM `+b.Schema()+`.jobs`).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != postgres.StatusCompleted || attempts != 1 {
		t.Errorf("job %s at attempt %d, want completed at attempt 1", status, attempts)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestExtendLeaseWhileAckAsyncInFlight: ExtendLease extends the lease of a
// delivery whose AckAsync waits for its batch (before, it refused with
// ErrAlreadySettled, and nothing could keep the lease), and reports
// ErrAlreadySettled once the ack is written. When the job was claimed again
// meanwhile, the extension does not report a loss of its own: the ack's
// outcome does (ErrLeaseLost), and the new claim is left alone.
func TestExtendLeaseWhileAckAsyncInFlight(t *testing.T) {
	pool := newPool(t, "berth-extendacking-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{Lease: time.Minute})
	ctx := testCtx(t)
	q := "extendacking_" + suffix()
	publishN(t, b, q, 2)
	ds := receiveN(t, b, q, 2)
	id := func(d sdk.Delivery) int64 { return d.(interface{ JobID() int64 }).JobID() }
	left := func(d sdk.Delivery) time.Duration {
		t.Helper()
		var us int64
		if err := pool.QueryRow(ctx, `SELECT (extract(epoch FROM visibility_until - now()) * 1e6)::bigint FROM `+b.Schema()+`.jobs WHERE id = $1`,
			id(d)).Scan(&us); err != nil {
			t.Fatal(err)
		}
		return time.Duration(us) * time.Microsecond
	}

	release := b.HoldAcks()
	defer release()
	results := make(chan error, 2)
	for _, d := range ds {
		d.(sdk.AsyncAcker).AckAsync(ctx, func(err error) { results <- err })
	}
	if err := ds[0].ExtendLease(ctx, time.Hour); err != nil {
		t.Fatalf("ExtendLease with the ack under way: %v, want nil", err)
	}
	if l := left(ds[0]); l < 50*time.Minute {
		t.Errorf("lease left after the extension: %s, want about 1h", l)
	}
	// ds[1]'s job is claimed again while its ack waits.
	if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET available_at = now() - interval '1 second',
		visibility_until = now() - interval '1 second' WHERE id = $1`, id(ds[1])); err != nil {
		t.Fatal(err)
	}
	taken := receiveN(t, b, q, 1)[0]
	if err := ds[1].ExtendLease(ctx, time.Hour); !errors.Is(err, sdk.ErrAlreadySettled) {
		t.Errorf("ExtendLease of a job claimed again, its ack under way: %v, want ErrAlreadySettled (the ack reports the loss)", err)
	}
	release()
	var lost, ok int
	for range 2 {
		switch err := <-results; {
		case err == nil:
			ok++
		case errors.Is(err, sdk.ErrLeaseLost):
			lost++
		default:
			t.Errorf("ack: %v", err)
		}
	}
	if ok != 1 || lost != 1 {
		t.Errorf("%d acks done, %d refused for a lost lease; want 1 and 1", ok, lost)
	}
	if err := ds[0].ExtendLease(ctx, time.Hour); !errors.Is(err, sdk.ErrAlreadySettled) {
		t.Errorf("ExtendLease after the ack: %v, want ErrAlreadySettled", err)
	}
	if err := taken.Ack(ctx); err != nil {
		t.Errorf("the new claim's Ack: %v", err)
	}
}
