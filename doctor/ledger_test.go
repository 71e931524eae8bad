package doctor_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
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

// TestLedgerIndexes: on the ledger's own tables doctor checks the indexes
// pgledger.SQL creates. A table made by an earlier release lacks the index
// List pages on (ledger_jobs_first_seen_idx): every page of berth jobs, the
// dashboard's job list, sorts the whole table. Before, nothing reported it.
// Migrate on the existing table creates it.
func TestLedgerIndexes(t *testing.T) {
	_, pool, schema := pgURL(t, nil)
	ctx := testCtx(t)
	store, err := pgledger.New(pool, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	table := schema + ".ledger_jobs"
	fs, err := doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.OK)
	// The table as an earlier release made it.
	if _, err := pool.Exec(ctx, `DROP INDEX `+schema+`.ledger_jobs_first_seen_idx`); err != nil {
		t.Fatal(err)
	}
	fs, err = doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.Warn)
	if f := find(fs, "ledger.indexes", table); len(f) != 1 || !strings.Contains(f[0].Evidence, "ledger_jobs_first_seen_idx") ||
		strings.Contains(f[0].Evidence, "ledger_jobs_updated_idx") {
		t.Errorf("ledger.indexes: %+v; want the first-seen index named, alone", f)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	fs, err = doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.OK)
}

// pagedReader is a ledger whose List returns jobs (and, when more, a
// cursor), as one page; Counts counts nothing.
type pagedReader struct {
	ledger.Reader
	jobs []ledger.Job
	more bool
}

func (p pagedReader) List(context.Context, ledger.Filter) (ledger.Page, error) {
	pg := ledger.Page{Jobs: p.jobs}
	if p.more {
		pg.Next = ledger.Cursor(time.Now(), "x")
	}
	return pg, nil
}

func (pagedReader) Counts(context.Context, ledger.Window) (ledger.Counts, error) {
	return ledger.Counts{ByStatus: map[ledger.Status]int64{}, ByClass: map[sdk.ErrorClass]int64{}}, nil
}

// TestLedgerDurationEvidence: the ledger.duration evidence says what was
// read. Doctor reads one page (ledger.MaxLimit jobs): with more, the count
// is a floor and the p99 a sample of the newest, which it says. Before, it
// said "1000 jobs finished" of a window with more, and "lease 0s, extended
// by the heartbeat" on a broker without a lease (RabbitMQ).
func TestLedgerDurationEvidence(t *testing.T) {
	ctx := testCtx(t)
	full := make([]ledger.Job, ledger.MaxLimit)
	for i := range full {
		full[i] = ledger.Job{MessageID: strconv.Itoa(i), Status: ledger.StatusSucceeded}
	}
	fs, err := doctor.Ledger(ctx, pagedReader{jobs: full, more: true}, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if f := find(fs, "ledger.duration", ""); len(f) != 1 || !strings.Contains(f[0].Evidence, "more than 1000 jobs finished") {
		t.Errorf("ledger.duration of a full page without durations: %+v; want \"more than 1000 jobs finished\"", f)
	}
	for i := range full {
		full[i].Duration = time.Millisecond
	}
	fs, err = doctor.Ledger(ctx, pagedReader{jobs: full, more: true}, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if f := find(fs, "ledger.duration", ""); len(f) != 1 || !strings.Contains(f[0].Evidence, "of 1000 runs, among the newest 1000 of more jobs") ||
		strings.Contains(f[0].Evidence, "lease 0s") || !strings.Contains(f[0].Evidence, "no broker lease") {
		t.Errorf("ledger.duration of a full page, no lease: %+v", f)
	}
	fs, err = doctor.Ledger(ctx, pagedReader{jobs: full[:3]}, 30*time.Second, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if f := find(fs, "ledger.duration", ""); len(f) != 1 || strings.Contains(f[0].Evidence, "newest") || !strings.Contains(f[0].Evidence, "of 3 runs (max 1ms)") ||
		!strings.Contains(f[0].Evidence, "lease 30s, extended by the heartbeat") {
		t.Errorf("ledger.duration of a partial page with a lease: %+v", f)
	}
}
