package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestBatchedAckLeaseLostMidBatch puts in one group-committed UPDATE the
// acks of four deliveries, one of which lost its lease meanwhile (its job was
// claimed again, by the same broker), and the ack of the job's new holder.
// The statement completes the rows whose lease is still held, reports the
// stale ack as ErrLeaseLost (one row, two acks: the outcome is per token, not
// per row) and changes nothing for it; the others succeed. Both the
// asynchronous ack (the Worker's) and Ack are in the batch.
func TestBatchedAckLeaseLostMidBatch(t *testing.T) {
	pool := newPool(t, "berth-batchack-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{Lease: time.Minute})
	ctx := testCtx(t)
	q := "batchack_" + suffix()
	publishN(t, b, q, 4)
	ds := receiveN(t, b, q, 4)
	id := func(d sdk.Delivery) int64 { return d.(interface{ JobID() int64 }).JobID() }

	// ds[1]'s lease runs out and its job is claimed again.
	if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET available_at = now() - interval '1 second',
		visibility_until = now() - interval '1 second' WHERE id = $1`, id(ds[1])); err != nil {
		t.Fatal(err)
	}
	taken := receiveN(t, b, q, 1)[0]
	if id(taken) != id(ds[1]) || taken.Attempt() != 2 {
		t.Fatalf("reclaimed job %d attempt %d, want job %d attempt 2", id(taken), taken.Attempt(), id(ds[1]))
	}

	release := b.HoldAcks()
	defer release()
	type result struct {
		name string
		err  error
	}
	results := make(chan result, 5)
	ackAsync := func(name string, d sdk.Delivery) {
		d.(sdk.AsyncAcker).AckAsync(ctx, func(err error) { results <- result{name, err} })
	}
	ackAsync("first", ds[0])
	ackAsync("stale", ds[1])
	ackAsync("third", ds[2])
	ackAsync("new holder", taken)
	go func() { results <- result{"fourth (Ack)", ds[3].Ack(ctx)} }()
	for b.PendingAcks() < 5 {
		select {
		case r := <-results:
			t.Fatalf("%s reported %v before its batch was written", r.name, r.err)
		case <-ctx.Done():
			t.Fatal("the five acks never were pending together")
		case <-time.After(5 * time.Millisecond):
		}
	}
	flushes, _ := b.AckStats()
	release()
	for range 5 {
		r := <-results
		switch {
		case r.name == "stale" && !errors.Is(r.err, sdk.ErrLeaseLost):
			t.Errorf("stale ack: %v, want ErrLeaseLost", r.err)
		case r.name != "stale" && r.err != nil:
			t.Errorf("%s ack: %v", r.name, r.err)
		}
	}
	if after, _ := b.AckStats(); after != flushes+1 {
		t.Errorf("%d statements for the batch, want 1", after-flushes)
	}

	// The stale delivery stays unsettled and keeps reporting the loss; the
	// others are settled.
	if err := ds[1].Ack(ctx); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Errorf("stale Ack again: %v, want ErrLeaseLost", err)
	}
	if err := ds[0].Ack(ctx); !errors.Is(err, sdk.ErrAlreadySettled) {
		t.Errorf("second Ack: %v, want ErrAlreadySettled", err)
	}
	done := make(chan error, 1)
	ds[2].(sdk.AsyncAcker).AckAsync(ctx, func(err error) { done <- err })
	if err := <-done; !errors.Is(err, sdk.ErrAlreadySettled) {
		t.Errorf("second AckAsync: %v, want ErrAlreadySettled", err)
	}
	var status string
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT status, attempt_count FROM `+b.Schema()+`.jobs WHERE id = $1`, id(taken)).
		Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != postgres.StatusCompleted || attempts != 2 {
		t.Errorf("the reclaimed row: %s, attempt %d; want completed by its new holder at attempt 2", status, attempts)
	}
	counts, err := b.CountByStatus(ctx, q)
	if err != nil || len(counts) != 1 || counts[postgres.StatusCompleted] != 4 {
		t.Errorf("CountByStatus = %v, %v; want 4 completed", counts, err)
	}
}

// TestAckAsyncContextEnds: an asynchronous ack whose context ends before its
// batch is written reports the context's error (the caller stops waiting);
// the row is still completed when the batch is written, as when a
// synchronous Ack gives up.
func TestAckAsyncContextEnds(t *testing.T) {
	pool := newPool(t, "berth-ackctx-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{Lease: time.Minute})
	ctx := testCtx(t)
	q := "ackctx_" + suffix()
	publishN(t, b, q, 1)
	d := receiveN(t, b, q, 1)[0]
	release := b.HoldAcks()
	defer release()
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	d.(sdk.AsyncAcker).AckAsync(actx, func(err error) { done <- err })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("AckAsync with its context cancelled: %v, want context.Canceled", err)
	}
	release()
	for {
		counts, err := b.CountByStatus(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if counts[postgres.StatusCompleted] == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the pending ack was never written: %v", counts)
		case <-time.After(10 * time.Millisecond):
		}
	}
	select {
	case err := <-done:
		t.Errorf("done called twice (second: %v)", err)
	default:
	}
}

// TestAckAsyncWithContextAlreadyDone: AckAsync given a context already
// done tells done of it once (or of the ack's outcome, should the batch
// come first). The context watch, run at once by context.AfterFunc for a
// done context, read the request's unregister function while AckAsync was
// still assigning it: a data race the race detector reports.
func TestAckAsyncWithContextAlreadyDone(t *testing.T) {
	pool := newPool(t, "berth-ackdone-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{Lease: time.Minute})
	q := "ackdone_" + suffix()
	const n = 50
	publishN(t, b, q, n)
	ds := receiveN(t, b, q, n)
	done, cancel := context.WithCancel(testCtx(t))
	cancel()
	outcomes := make(chan error, 2*n)
	for _, d := range ds {
		d.(sdk.AsyncAcker).AckAsync(done, func(err error) { outcomes <- err })
	}
	for range n {
		if err := <-outcomes; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("AckAsync with a done context: %v; want nil or context.Canceled", err)
		}
	}
	select {
	case err := <-outcomes:
		t.Errorf("AckAsync told its outcome twice (then %v)", err)
	default:
	}
}
