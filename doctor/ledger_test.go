package doctor_test

import (
	"context"
	"errors"
	"fmt"
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
	store := migratedLedger(t, pool, schema)
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
	store := migratedLedger(t, pool, schema)
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

// failingIndexes is a ledger whose index query fails with err (as
// Indexes, and as MissingIndexes, which doctor called before).
type failingIndexes struct {
	pagedReader
	err error
}

func (failingIndexes) Table() string { return `"s"."ledger_jobs"` }
func (f failingIndexes) Indexes(context.Context) ([]pgledger.Index, error) {
	return nil, fmt.Errorf("pgledger: indexes: %w", f.err)
}
func (f failingIndexes) MissingIndexes(context.Context) ([]string, error) {
	return nil, fmt.Errorf("pgledger: indexes: %w", f.err)
}

// TestLedgerIndexFailureKeepsFindings: the index query failing (or timing
// out) is a finding of its own; the four ledger findings computed before
// it stand. Before, Ledger returned the error alone, and Run none of the
// ledger's findings.
func TestLedgerIndexFailureKeepsFindings(t *testing.T) {
	ctx := testCtx(t)
	four := []string{"ledger.duration", "ledger.same-error-exhausted", "ledger.retry-storm", "ledger.dlq-growth"}
	denied := errors.New("ERROR: permission denied for table pg_index (SQLSTATE 42501)")
	fs, err := doctor.Ledger(ctx, failingIndexes{err: denied}, 0, doctor.Options{})
	if err != nil {
		t.Fatalf("Ledger: %v; want the failure as a finding", err)
	}
	for _, id := range four {
		if len(find(fs, id, "")) != 1 {
			t.Errorf("%s dropped: %s", id, ids(fs))
		}
	}
	expect(t, fs, "ledger.indexes", "s.ledger_jobs", doctor.Info)
	if f := find(fs, "ledger.indexes", ""); len(f) != 1 || !strings.Contains(f[0].Evidence, denied.Error()) || !strings.Contains(f[0].Summary, "not checked") {
		t.Errorf("ledger.indexes: %+v; want the failure, not checked", f)
	}

	fs, err = doctor.Ledger(ctx, failingIndexes{err: context.DeadlineExceeded}, 0, doctor.Options{})
	if err != nil {
		t.Fatalf("Ledger: %v; want the timeout as a finding", err)
	}
	for _, id := range four {
		if len(find(fs, id, "")) != 1 {
			t.Errorf("%s dropped after a timeout: %s", id, ids(fs))
		}
	}
	expect(t, fs, "doctor.check-timeout", "s.ledger_jobs", doctor.Error)
	if len(find(fs, "ledger.indexes", "")) != 0 {
		t.Errorf("a timed-out index check reported as ledger.indexes too: %s", ids(fs))
	}

	// An interrupt still stops the run.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := doctor.Ledger(cctx, failingIndexes{err: context.Canceled}, 0, doctor.Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Ledger with a cancelled context: %v, want context.Canceled", err)
	}
}

// TestLedgerIndexDefinitions: an index of the right name that is not the
// one pgledger.SQL creates (other columns, as an earlier release or a hand
// made it; a unique one; one with a predicate) is reported with what the
// database holds and the statements that replace it. Before, doctor
// counted an index by its name and passed them. Storage parameters are no
// mismatch.
func TestLedgerIndexDefinitions(t *testing.T) {
	_, pool, schema := pgURL(t, nil)
	ctx := testCtx(t)
	store := migratedLedger(t, pool, schema)
	table := schema + ".ledger_jobs"
	// An index tuned by a DBA (fillfactor) is still the index.
	if _, err := pool.Exec(ctx, `ALTER INDEX `+schema+`.ledger_jobs_updated_idx SET (fillfactor = 80)`); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.OK)

	const hostile = "\x1b[31m\u202e"
	for _, stmt := range []string{
		`DROP INDEX ` + schema + `.ledger_jobs_queue_status_idx`, // an earlier release's columns
		`CREATE INDEX ledger_jobs_queue_status_idx ON ` + schema + `.ledger_jobs (queue, status)`,
		`DROP INDEX ` + schema + `.ledger_jobs_first_seen_idx`, // a predicate, with control characters in it
		`CREATE INDEX ledger_jobs_first_seen_idx ON ` + schema + `.ledger_jobs (first_seen_at, message_id) WHERE queue <> '` + hostile + `'`,
		`DROP INDEX ` + schema + `.ledger_jobs_key_idx`, // unique: the same columns, refusing rows
		`CREATE UNIQUE INDEX ledger_jobs_key_idx ON ` + schema + `.ledger_jobs (idempotency_key, first_seen_at) WHERE idempotency_key IS NOT NULL`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	fs, err = doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.Warn)
	f := find(fs, "ledger.indexes", table)
	if len(f) != 1 {
		t.Fatalf("ledger.indexes: %+v", f)
	}
	ev, fix := f[0].Evidence, f[0].Fix
	for _, want := range []string{
		`ledger_jobs_queue_status_idx defined as "CREATE INDEX ledger_jobs_queue_status_idx ON ` + table + ` USING btree (queue, status)", not as pgledger.SQL has it ("btree (queue, status, updated_at, message_id)")`,
		`WHERE (queue <> '` + hostile + `'::text)`, // as read: berth doctor escapes it on the terminal
		`ledger_jobs_key_idx defined as "CREATE UNIQUE INDEX`,
	} {
		if !strings.Contains(ev, want) {
			t.Errorf("evidence lacks %q:\n%s", want, ev)
		}
	}
	if strings.Contains(ev, "ledger_jobs_updated_idx") {
		t.Errorf("evidence names the matching index: %s", ev)
	}
	for _, want := range []string{
		`DROP INDEX CONCURRENTLY IF EXISTS "` + schema + `"."ledger_jobs_queue_status_idx_new"; CREATE INDEX CONCURRENTLY IF NOT EXISTS "ledger_jobs_queue_status_idx_new" ON "` + schema + `"."ledger_jobs" (queue, status, updated_at, message_id); ` +
			`DROP INDEX CONCURRENTLY IF EXISTS "` + schema + `"."ledger_jobs_queue_status_idx"; ALTER INDEX "` + schema + `"."ledger_jobs_queue_status_idx_new" RENAME TO "ledger_jobs_queue_status_idx"`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "ledger_jobs_key_idx_new" ON "` + schema + `"."ledger_jobs" (idempotency_key, first_seen_at) WHERE idempotency_key IS NOT NULL`,
		`"ledger_jobs_first_seen_idx_new" ON "` + schema + `"."ledger_jobs" (first_seen_at, message_id)`,
	} {
		if !strings.Contains(fix, want) {
			t.Errorf("fix lacks %q:\n%s", want, fix)
		}
	}
	// Migrate keeps them (IF NOT EXISTS); the statements of the fix
	// replace them.
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ixs, err := store.Indexes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ix := range ixs {
		if ix.OK() {
			continue
		}
		for _, stmt := range []string{ix.Drop, ix.Create(true)} {
			if _, err := pool.Exec(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
	}
	fs, err = doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.OK)
}
