package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// Regression tests of the review of the PostgreSQL broker: delays count from
// the publish, and delayed jobs wake a Receive that is already waiting.
// The bounds are generous: they tell "woken" from "left to the poll"
// (PollInterval 10s), not fast from slow.

// wokenBound is the latest a job due in 200ms may arrive at a Receive that
// was woken for it; with PollInterval 10s, a Receive left to its poll
// would take up to 10s.
const wokenBound = 3 * time.Second

// receiveAsync starts a Receive of one job of queue and returns the channel
// of its outcome; it waits until that Receive has found the queue empty and
// sleeps.
func receiveAsync(t *testing.T, ctx context.Context, b *postgres.Broker, queue string) <-chan receiveResult {
	t.Helper()
	got := make(chan receiveResult, 1)
	go func() {
		ds, err := b.Receive(ctx, queue, 1)
		got <- receiveResult{ds, err, time.Now()}
	}()
	time.Sleep(500 * time.Millisecond) // the Receive found nothing and sleeps
	select {
	case r := <-got:
		t.Fatalf("Receive returned before anything was due: %v, %d deliveries", r.err, len(r.ds))
	default:
	}
	return got
}

type receiveResult struct {
	ds  []sdk.Delivery
	err error
	at  time.Time
}

// wantWoken fails the test unless the Receive behind got returns one
// delivery within wokenBound of start.
func wantWoken(t *testing.T, got <-chan receiveResult, start time.Time, what string) {
	t.Helper()
	select {
	case r := <-got:
		if r.err != nil || len(r.ds) != 1 {
			t.Fatalf("Receive: %v, %d deliveries", r.err, len(r.ds))
		}
		if lat := r.at.Sub(start); lat > wokenBound {
			t.Fatalf("%s due after 200ms reached the waiting Receive after %s: not woken, left to its poll (PollInterval 10s)", what, lat)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("%s due after 200ms never reached the waiting Receive", what)
	}
}

// Defect 1: PublishTx counted Delay from the start of the caller's
// transaction (now()), so a job published late in a long transaction was
// due at once.
func TestPublishTxDelayCountsFromPublishNotTxStart(t *testing.T) {
	pool := newPool(t, "fix-txdelay-"+suffix(), 8)
	b := newBroker(t, pool, postgres.Options{PollInterval: 100 * time.Millisecond})
	ctx := testCtx(t)
	const delay = 2 * time.Second
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the business update; now() is fixed here
		t.Fatal(err)
	}
	time.Sleep(delay) // the transaction does other work
	published := time.Now()
	if err := b.PublishTx(ctx, tx, "q", &sdk.Message{Body: []byte("x"), Delay: delay}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "q", 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %v, %d deliveries", err, len(ds))
	}
	if el := time.Since(published); el < delay {
		t.Fatalf("job published with Delay %s late in a transaction delivered %s after PublishTx", delay, el)
	}
	// The row says the same: due Delay after the publish, by the server's clock.
	// created_at is the transaction's start, at least Delay before the
	// PublishTx: available_at is at least 2×Delay after it.
	var early bool
	if err := pool.QueryRow(ctx, `SELECT available_at < created_at + $1 * interval '1 microsecond'
		FROM `+b.Schema()+`.jobs`, (delay * 3 / 2).Microseconds()).Scan(&early); err != nil {
		t.Fatal(err)
	}
	if early {
		t.Fatal("available_at is less than 1.5×Delay after the transaction's start: Delay counted from the start of the transaction")
	}
}

// Defect 2: a delayed Publish did not notify, so a Receive already asleep
// on the empty queue slept until its old deadline (up to PollInterval).
// The job is published by another broker on the same table, as from
// another process: only the NOTIFY can wake the waiting Receive.
func TestDelayedPublishWakesWaitingReceive(t *testing.T) {
	pool := newPool(t, "fix-delaypub-"+suffix(), 8)
	b := newBroker(t, pool, postgres.Options{PollInterval: 10 * time.Second})
	pub, err := postgres.New(pool, postgres.Options{Schema: b.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	ctx := testCtx(t)
	got := receiveAsync(t, ctx, b, "q")
	start := time.Now()
	if err := pub.Publish(ctx, "q", &sdk.Message{Body: []byte("x"), Delay: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	wantWoken(t, got, start, "job published")
}

// Defect 2, PublishTx: the NOTIFY of a delayed job comes at commit.
func TestDelayedPublishTxWakesWaitingReceive(t *testing.T) {
	pool := newPool(t, "fix-delaypubtx-"+suffix(), 8)
	b := newBroker(t, pool, postgres.Options{PollInterval: 10 * time.Second})
	ctx := testCtx(t)
	got := receiveAsync(t, ctx, b, "q")
	start := time.Now()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := b.PublishTx(ctx, tx, "q", &sdk.Message{Body: []byte("x"), Delay: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantWoken(t, got, start, "job published in a transaction")
}

// Defect 2, settlements: Retry(d) and Release(d) with d > 0 did not notify.
func TestDelayedRetryAndReleaseWakeWaitingReceive(t *testing.T) {
	for _, tc := range []struct {
		name   string
		settle func(ctx context.Context, d sdk.Delivery) error
	}{
		{"Retry", func(ctx context.Context, d sdk.Delivery) error {
			return d.Retry(ctx, 200*time.Millisecond, errors.New("boom"))
		}},
		{"Release", func(ctx context.Context, d sdk.Delivery) error {
			return d.(sdk.Releaser).Release(ctx, 200*time.Millisecond)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := newPool(t, "fix-settle-"+suffix(), 8)
			b := newBroker(t, pool, postgres.Options{PollInterval: 10 * time.Second})
			ctx := testCtx(t)
			d := leaseOne(t, ctx, b)
			// The only job is leased for 30s: the waiting Receive sleeps
			// PollInterval.
			got := receiveAsync(t, ctx, b, "q")
			start := time.Now()
			if err := tc.settle(ctx, d); err != nil {
				t.Fatal(err)
			}
			wantWoken(t, got, start, "job handed back with "+tc.name)
		})
	}
}
