package doctor_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// pgJobs returns a PostgreSQL broker in a fresh schema and the ledger
// reader of its jobs table.
func pgJobs(t *testing.T) (*postgres.Broker, ledger.Reader) {
	t.Helper()
	u, pool, schema := pgURL(t, nil)
	b := open(t, u)
	var pb *postgres.Broker
	if as, ok := b.(interface{ As(any) bool }); !ok || !as.As(&pb) {
		t.Fatalf("%T: not a PostgreSQL broker", b)
	}
	r, err := pgledger.NewJobs(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	return pb, r
}

func receiveOne(t *testing.T, b sdk.Broker, q string) sdk.Delivery {
	t.Helper()
	ds, err := b.Receive(testCtx(t), q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	return ds[0]
}

func TestLedgerDefaultsPass(t *testing.T) {
	b, r := pgJobs(t)
	ctx := testCtx(t)
	publish(t, b, "billing", 2)
	for range 2 {
		if err := receiveOne(t, b, "billing").Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fs, err := doctor.Ledger(ctx, r, b.Lease(), doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clean(t, fs)
	expect(t, fs, "ledger.duration", "", doctor.Info) // the jobs table keeps no run times
	for _, id := range []string{"ledger.same-error-exhausted", "ledger.retry-storm", "ledger.dlq-growth"} {
		expect(t, fs, id, "", doctor.OK)
	}
}

// TestLedgerMisconfigured: a permanent error ("no such account") treated as
// transient is retried to exhaustion on several jobs; other jobs keep
// retrying; the dead letters grow.
func TestLedgerMisconfigured(t *testing.T) {
	b, r := pgJobs(t)
	ctx := testCtx(t)
	cause := errors.New("payment API: no such account")
	for range 4 {
		publish(t, b, "billing", 1)
		if err := receiveOne(t, b, "billing").Retry(ctx, 0, cause); err != nil {
			t.Fatal(err)
		}
		if err := receiveOne(t, b, "billing").DeadLetter(ctx, cause); err != nil {
			t.Fatal(err)
		}
	}
	publish(t, b, "emails", 4)
	for range 4 {
		if err := receiveOne(t, b, "emails").Retry(ctx, time.Hour, errors.New("smtp: 421 try later")); err != nil {
			t.Fatal(err)
		}
	}
	fs, err := doctor.Ledger(ctx, r, b.Lease(), doctor.Options{SameError: 3, RetryStorm: 3, DLQGrowth: 3})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.same-error-exhausted", "", doctor.Warn)
	expect(t, fs, "ledger.retry-storm", "", doctor.Warn)
	expect(t, fs, "ledger.dlq-growth", "", doctor.Warn)
}

// TestLedgerDurations: run times recorded by the ledger (a Worker observer)
// near the jobs' timeout are reported; well within it they pass.
func TestLedgerDurations(t *testing.T) {
	_, pool, schema := pgURL(t, nil)
	ctx := testCtx(t)
	store, err := pgledger.New(pool, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := ledger.New(ledger.Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const n = 5
	done := make(chan struct{}, n)
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
		time.Sleep(30 * time.Millisecond)
		done <- struct{}{}
		return nil
	})
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: "reports", Observers: []sdk.Observer{l}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	publish(t, b, "reports", n)
	for range n {
		<-done
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Ledger(ctx, store, b.Lease(), doctor.Options{LongestJob: 35 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.duration", "", doctor.Warn)
	fs, err = doctor.Ledger(ctx, store, b.Lease(), doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.duration", "", doctor.OK)
}
