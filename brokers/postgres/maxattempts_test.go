package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestWorkerMaxAttemptsOverDefaultCap is issue 14's repro as a new user met
// it: Worker MaxAttempts 8 on a broker with the default max_attempts (5).
// Before, the handler ran 5 times and the dead letter said "max deliveries
// exceeded"; now NewWorker refuses it under StrictConfig, and otherwise the
// Worker dead-letters the fifth attempt itself with the handler's error.
func TestWorkerMaxAttemptsOverDefaultCap(t *testing.T) {
	pool := newPool(t, "berth-maxattempts-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{PollInterval: 50 * time.Millisecond})
	ctx := testCtx(t)
	q := "maxattempts_" + suffix()
	id := publishN(t, b, q, 1)[0]

	var runs atomic.Int32
	h := sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		runs.Add(1)
		return fmt.Errorf("payment API said no (attempt %d)", d.Attempt())
	})
	opts := sdk.WorkerOptions{Queue: q, StrictConfig: true, Logger: slog.New(slog.DiscardHandler),
		Retry: sdk.RetryPolicy{MaxAttempts: 8, Backoff: sdk.Backoff{Base: time.Millisecond, Max: time.Millisecond}}}
	if _, err := sdk.NewWorker(b, h, opts); !errors.Is(err, sdk.ErrConfigConflict) {
		t.Fatalf("NewWorker with StrictConfig: %v, want ErrConfigConflict", err)
	}
	opts.StrictConfig = false
	w, err := sdk.NewWorker(b, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	var status, reason, class string
	for {
		if err := pool.QueryRow(ctx, `SELECT status, COALESCE(headers->>$2, ''), COALESCE(headers->>$3, '') FROM `+b.Schema()+`.jobs
			WHERE message_id = $1`, id, sdk.HeaderDeadLetterReason, sdk.HeaderDeadLetterClass).Scan(&status, &reason, &class); err != nil {
			t.Fatal(err)
		}
		if status == postgres.StatusDeadLetter {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job still %s", status)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := runs.Load(); n != 5 {
		t.Errorf("handler ran %d times, want 5", n)
	}
	if want := "payment API said no (attempt 5)"; reason != want || class != string(sdk.ClassTransient) {
		t.Errorf("dead letter reason %q class %q, want %q %q", reason, class, want, sdk.ClassTransient)
	}
}

// TestPoisonKeepsLastError: a job the claim finds past max_attempts (the
// Worker could not dead-letter it: it crashed, or ran with another cap) is
// dead-lettered with "max deliveries exceeded" and the last Retry's cause.
func TestPoisonKeepsLastError(t *testing.T) {
	pool := newPool(t, "berth-poisonlast-"+suffix(), 2)
	const lease = 100 * time.Millisecond
	b := newBroker(t, pool, postgres.Options{MaxAttempts: 2, Lease: lease, PollInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	q := "poisonlast_" + suffix()
	id := publishN(t, b, q, 1)[0]
	if err := receiveN(t, b, q, 1)[0].Retry(ctx, 0, errors.New("ledger API: 503 (attempt 1)")); err != nil {
		t.Fatal(err)
	}
	_ = receiveN(t, b, q, 1)[0] // attempt 2 crashes: never settled
	receiveUntilDeadLettered(t, b, pool, q, id, lease)
	var lastErr, reason, class string
	if err := pool.QueryRow(ctx, `SELECT last_error, headers->>$2, headers->>$3 FROM `+b.Schema()+`.jobs WHERE message_id = $1`,
		id, sdk.HeaderDeadLetterReason, sdk.HeaderDeadLetterClass).Scan(&lastErr, &reason, &class); err != nil {
		t.Fatal(err)
	}
	want := sdk.ErrMaxDeliveries.Error() + "; last error: ledger API: 503 (attempt 1)"
	if lastErr != want || reason != want || class != string(sdk.ClassPoison) {
		t.Errorf("last_error %q, reason %q, class %q; want %q, %q", lastErr, reason, class, want, sdk.ClassPoison)
	}
}

// TestPoisonFirstFailureFromRow: a job the claim dead-letters past
// max_attempts gets the row's own first_failure_at as its first-failure
// header, whatever the publisher put there. The old claim kept a
// berth-first-failure header already on the row over the broker's own
// record, so the dead letter said the job first failed in 2001. Publish
// refuses berth- headers, but a row written by hand or by another tool
// (see TestHandWrittenHeadersDoNotPoisonClaim) carries whatever its writer
// put there: stale, copied from another message, or forged.
func TestPoisonFirstFailureFromRow(t *testing.T) {
	pool := newPool(t, "berth-poisonfirst-"+suffix(), 2)
	const lease = 100 * time.Millisecond
	b := newBroker(t, pool, postgres.Options{MaxAttempts: 2, Lease: lease, PollInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	q := "poisonfirst_" + suffix()
	const forged = "2001-01-01T00:00:00Z"
	m := &sdk.Message{Body: []byte("x")}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+b.Schema()+`.jobs SET headers = jsonb_build_object($1::text, $2::text)`,
		sdk.HeaderFirstFailure, forged); err != nil {
		t.Fatal(err)
	}
	if err := receiveN(t, b, q, 1)[0].Retry(ctx, 0, errors.New("attempt 1 failed")); err != nil {
		t.Fatal(err)
	}
	_ = receiveN(t, b, q, 1)[0] // attempt 2 crashes: never settled
	receiveUntilDeadLettered(t, b, pool, q, m.ID, lease)
	var header string
	var firstAt time.Time
	if err := pool.QueryRow(ctx, `SELECT headers->>$2, first_failure_at FROM `+b.Schema()+`.jobs WHERE message_id = $1`,
		m.ID, sdk.HeaderFirstFailure).Scan(&header, &firstAt); err != nil {
		t.Fatal(err)
	}
	got, err := time.Parse(time.RFC3339Nano, header)
	if err != nil {
		t.Fatalf("first-failure header %q: %v", header, err)
	}
	if !got.Equal(firstAt) {
		t.Errorf("first-failure header %s; the row's first_failure_at is %s", header, firstAt.UTC().Format(time.RFC3339Nano))
	}
}

// receiveUntilDeadLettered receives from q, where job id has used up its
// attempts and its lease will end, until a claim has dead-lettered it: every
// Receive must come back empty. One Receive of a few leases was not enough
// on a loaded machine: a stall across its whole deadline left no claim after
// the lease ended, and the row was still processing.
func receiveUntilDeadLettered(t *testing.T, b *postgres.Broker, pool *pgxpool.Pool, q, id string, lease time.Duration) {
	t.Helper()
	ctx := testCtx(t)
	for {
		short, cancel := context.WithTimeout(ctx, 2*lease)
		ds, err := b.Receive(short, q, 1)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Receive after max attempts: %d deliveries, %v; want none", len(ds), err)
		}
		var status string
		if err := pool.QueryRow(ctx, `SELECT status FROM `+b.Schema()+`.jobs WHERE message_id = $1`, id).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status == postgres.StatusDeadLetter {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("job still %s", status)
		}
	}
}

// TestMaxAttemptsBeyondIntegerRefused: max_attempts is a PostgreSQL integer.
// A MaxAttempts above its range (math.MaxInt, say, for "no broker cap") used
// to be accepted by New and then fail every Publish, as a broker
// "unavailable" that a caller or the outbox relay retries forever. New now
// refuses it; the largest integer works end to end.
func TestMaxAttemptsBeyondIntegerRefused(t *testing.T) {
	pool := newPool(t, "berth-maxattempts-range-"+suffix(), 4)
	ctx := testCtx(t)
	for _, n := range []int{math.MaxInt32 + 1, math.MaxInt} {
		b, err := postgres.New(pool, postgres.Options{MaxAttempts: n, Schema: freshSchema(t, pool)})
		if errors.Is(err, postgres.ErrInvalidOptions) {
			continue
		}
		if err == nil {
			if err = b.Migrate(ctx); err == nil {
				err = b.Publish(ctx, "maxattempts_range_"+suffix(), &sdk.Message{Body: []byte("x")})
			}
			_ = b.Close()
		}
		t.Errorf("New(MaxAttempts %d) accepted it; the Publish that follows: %v", n, err)
	}
	b := newBroker(t, pool, postgres.Options{MaxAttempts: math.MaxInt32, PollInterval: 50 * time.Millisecond})
	q := "maxattempts_range_" + suffix()
	if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatalf("Publish with MaxAttempts math.MaxInt32: %v", err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %v, %d deliveries", err, len(ds))
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatalf("Ack: %v", err)
	}
}
