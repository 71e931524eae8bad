package postgres_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

func TestSchemaSQLMatchesEmbeddedFile(t *testing.T) {
	file, err := os.ReadFile("schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	got, err := postgres.SchemaSQL(postgres.DefaultSchema)
	if err != nil {
		t.Fatalf("SchemaSQL: %v", err)
	}
	if got != string(file) {
		t.Error("SchemaSQL(DefaultSchema) differs from schema.sql")
	}
	other, err := postgres.SchemaSQL("Tenant_42")
	if err != nil {
		t.Fatalf("SchemaSQL: %v", err)
	}
	if !strings.Contains(other, `CREATE TABLE IF NOT EXISTS "Tenant_42".jobs`) || strings.Contains(other, `"berth"`) {
		t.Errorf("SchemaSQL(Tenant_42) does not quote the schema everywhere:\n%s", other)
	}
}

func TestInvalidSchemaRejected(t *testing.T) {
	pool := newPool(t, "berth-invalid-schema", 1)
	for _, s := range []string{"1abc", "a-b", `x"; DROP TABLE jobs; --`, "pg_catalog", "has space",
		"été", strings.Repeat("a", 49)} {
		if _, err := postgres.SchemaSQL(s); !errors.Is(err, postgres.ErrInvalidSchema) {
			t.Errorf("SchemaSQL(%q): %v, want ErrInvalidSchema", s, err)
		}
		if _, err := postgres.New(pool, postgres.Options{Schema: s}); !errors.Is(err, postgres.ErrInvalidSchema) {
			t.Errorf("New(Schema %q): %v, want ErrInvalidSchema", s, err)
		}
	}
	if _, err := postgres.New(nil, postgres.Options{}); !errors.Is(err, postgres.ErrInvalidOptions) {
		t.Errorf("New(nil pool): %v, want ErrInvalidOptions", err)
	}
	if _, err := postgres.New(pool, postgres.Options{Lease: -time.Second}); !errors.Is(err, postgres.ErrInvalidOptions) {
		t.Errorf("New(negative Lease): %v, want ErrInvalidOptions", err)
	}
}

// TestInvalidWorkerIDRejected: a WorkerID PostgreSQL text cannot hold (a
// NUL byte, invalid UTF-8) is refused by New. It was accepted, and every
// claim, which writes it into worker_id, failed (SQLSTATE 22021): a broker
// that could never receive a job.
func TestInvalidWorkerIDRejected(t *testing.T) {
	pool := newPool(t, "berth-invalid-worker-id", 1)
	for _, w := range []string{"host\x00-1", "host\xff-1"} {
		b, err := postgres.New(pool, postgres.Options{WorkerID: w})
		if !errors.Is(err, postgres.ErrInvalidOptions) {
			t.Errorf("New(WorkerID %q): %v, want ErrInvalidOptions", w, err)
		}
		if b != nil {
			_ = b.Close()
		}
	}
}

// TestMigrateCreatesReferenceSchema checks the columns of the reference jobs
// table (ARCHITECTURE.md, "Reference schema and the billing scenario") and the claim indexes, and that Migrate is idempotent
// when run concurrently and again.
func TestMigrateCreatesReferenceSchema(t *testing.T) {
	pool := newPool(t, "berth-migrate-"+suffix(), 8)
	schema := freshSchema(t, pool)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		b, err := postgres.New(pool, postgres.Options{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		wg.Go(func() { errs <- b.Migrate(ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
	b := newBroker(t, pool, postgres.Options{Schema: schema}) // and once more
	_ = b
	rows, _ := pool.Query(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'jobs'`, schema)
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"id", "job_type", "payload_json", "status", "attempt_count", "max_attempts",
		"available_at", "visibility_until", "worker_id", "idempotency_key", "last_error", "created_at", "updated_at",
		"queue", "headers", "lease_token", "payload", "message_id", "correlation_id", "ordering_key"} {
		if !slices.Contains(cols, c) {
			t.Errorf("jobs has no column %s (has %v)", c, cols)
		}
	}
	rows, _ = pool.Query(ctx, `SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = 'jobs'`, schema)
	idx, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []string{"jobs_claim_idx", "jobs_dedupe_idx", "jobs_dead_letter_idx", "jobs_completed_idx", "jobs_dead_letter_page_idx"} {
		if !slices.Contains(idx, i) {
			t.Errorf("jobs has no index %s (has %v)", i, idx)
		}
	}
	// Status values outside the reference set are refused by the table.
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.jobs (queue, message_id, payload, max_attempts, status)
		VALUES ('q', 'm', '', 1, 'bogus')`); err == nil {
		t.Error("the jobs table accepted status 'bogus'")
	}
}

// TestStoredRow checks what a published job looks like to SQL, and what a
// claim and a dead-letter write.
func TestStoredRow(t *testing.T) {
	pool := newPool(t, "berth-row-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{WorkerID: "worker-row", MaxAttempts: 7})
	ctx := testCtx(t)
	q := "row_" + suffix()
	js := &sdk.Message{Type: "billing.charge", IdempotencyKey: "charge:order_1:v1", Key: "order_1",
		Headers: map[string]string{"x-a": "1"}, Body: []byte(`{"order": "order_1"}`)}
	bin := &sdk.Message{Type: "blob", Body: []byte{0xff, 0x00, 0x01}}
	if err := b.Publish(ctx, q, js, bin); err != nil {
		t.Fatal(err)
	}
	var (
		status, jobType     string
		payloadJSON         *string
		attempts, maxAttemp int
	)
	err := pool.QueryRow(ctx, `SELECT status, job_type, payload_json::text, attempt_count, max_attempts
		FROM `+b.Schema()+`.jobs WHERE message_id = $1`, js.ID).Scan(&status, &jobType, &payloadJSON, &attempts, &maxAttemp)
	if err != nil {
		t.Fatal(err)
	}
	if status != postgres.StatusQueued || jobType != js.Type || payloadJSON == nil || *payloadJSON != string(js.Body) ||
		attempts != 0 || maxAttemp != 7 {
		t.Errorf("row = %s %s %v %d/%d, want queued %s %s 0/7", status, jobType, payloadJSON, attempts, maxAttemp, js.Type, js.Body)
	}
	if err := pool.QueryRow(ctx, `SELECT payload_json::text FROM `+b.Schema()+`.jobs WHERE message_id = $1`, bin.ID).
		Scan(&payloadJSON); err != nil || payloadJSON != nil {
		t.Errorf("payload_json of a binary body = %v (%v), want NULL", payloadJSON, err)
	}

	ds, err := b.Receive(ctx, q, 2)
	if err != nil || len(ds) != 2 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	var (
		worker  string
		lease   time.Time
		tokenOK bool
	)
	if err := pool.QueryRow(ctx, `SELECT status, worker_id, attempt_count, visibility_until, lease_token IS NOT NULL
		FROM `+b.Schema()+`.jobs WHERE message_id = $1`, js.ID).Scan(&status, &worker, &attempts, &lease, &tokenOK); err != nil {
		t.Fatal(err)
	}
	if status != postgres.StatusProcessing || worker != "worker-row" || attempts != 1 || !tokenOK || !lease.After(time.Now().Add(-time.Minute)) {
		t.Errorf("claimed row = %s %s attempt %d lease %s token %v", status, worker, attempts, lease, tokenOK)
	}
	for _, d := range ds {
		if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("order missing"))); err != nil {
			t.Fatal(err)
		}
	}
	var lastErr, reason string
	if err := pool.QueryRow(ctx, `SELECT status, last_error, headers->>$2 FROM `+b.Schema()+`.jobs WHERE message_id = $1`,
		js.ID, sdk.HeaderDeadLetterReason).Scan(&status, &lastErr, &reason); err != nil {
		t.Fatal(err)
	}
	if status != postgres.StatusDeadLetter || lastErr != "permanent: order missing" || reason != lastErr {
		t.Errorf("dead-lettered row = %s, last_error %q, reason header %q", status, lastErr, reason)
	}
	counts, err := b.CountByStatus(ctx, q)
	if err != nil || counts[postgres.StatusDeadLetter] != 2 || len(counts) != 1 {
		t.Errorf("CountByStatus = %v, %v; want 2 dead_letter", counts, err)
	}
}

// TestStaleWorkerCannotSettle: worker A's lease expires and worker B claims
// the jobs; nothing A does afterwards changes the rows.
func TestStaleWorkerCannotSettle(t *testing.T) {
	pool := newPool(t, "berth-stale-"+suffix(), 4)
	const lease = 300 * time.Millisecond
	a := newBroker(t, pool, postgres.Options{WorkerID: "worker-a", Lease: lease})
	b := newBroker(t, pool, postgres.Options{WorkerID: "worker-b", Lease: time.Minute, Schema: a.Schema()})
	ctx := testCtx(t)
	q := "stale_" + suffix()
	if err := a.Publish(ctx, q, &sdk.Message{Body: []byte("1")}, &sdk.Message{Body: []byte("2")},
		&sdk.Message{Body: []byte("3")}, &sdk.Message{Body: []byte("4")}); err != nil {
		t.Fatal(err)
	}
	stale := receiveN(t, a, q, 4)
	time.Sleep(lease + 50*time.Millisecond)
	fresh := receiveN(t, b, q, 4)
	for _, d := range fresh {
		if d.Attempt() != 2 {
			t.Errorf("takeover Attempt() = %d, want 2", d.Attempt())
		}
	}
	settlements := map[string]func(d sdk.Delivery) error{
		"Ack":         func(d sdk.Delivery) error { return d.Ack(ctx) },
		"Retry":       func(d sdk.Delivery) error { return d.Retry(ctx, 0, errors.New("stale")) },
		"DeadLetter":  func(d sdk.Delivery) error { return d.DeadLetter(ctx, errors.New("stale")) },
		"ExtendLease": func(d sdk.Delivery) error { return d.ExtendLease(ctx, time.Hour) },
		"Release":     func(d sdk.Delivery) error { return d.(sdk.Releaser).Release(ctx, 0) },
	}
	for name, settle := range settlements {
		for _, d := range stale {
			if err := settle(d); !errors.Is(err, sdk.ErrLeaseLost) {
				t.Errorf("stale %s: %v, want ErrLeaseLost", name, err)
			}
		}
	}
	rows, _ := pool.Query(ctx, `SELECT status, worker_id, attempt_count, last_error IS NULL, visibility_until > now() + interval '30 seconds'
		FROM `+a.Schema()+`.jobs WHERE queue = $1`, q)
	type row struct {
		Status, Worker string
		Attempts       int
		NoError, Lease bool
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range got {
		if r != (row{postgres.StatusProcessing, "worker-b", 2, true, true}) {
			t.Errorf("row after stale settlements = %+v, want processing by worker-b, attempt 2, its own lease", r)
		}
	}
	for _, d := range fresh {
		if err := d.Ack(ctx); err != nil {
			t.Errorf("Ack by the lease holder: %v", err)
		}
	}
	counts, err := b.CountByStatus(ctx, q)
	if err != nil || counts[postgres.StatusCompleted] != 4 {
		t.Errorf("CountByStatus = %v, %v; want 4 completed", counts, err)
	}
}

func receiveN(t *testing.T, b *postgres.Broker, q string, n int) []sdk.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []sdk.Delivery
	for len(out) < n {
		ds, err := b.Receive(ctx, q, n-len(out))
		if err != nil {
			t.Fatalf("Receive (have %d of %d): %v", len(out), n, err)
		}
		out = append(out, ds...)
	}
	return out
}

// TestPublishTx: a job enqueued in a rolled-back transaction does not exist;
// one enqueued in a committed transaction is processed, and its NOTIFY at
// commit wakes a waiting Receive long before the poll would.
func TestPublishTx(t *testing.T) {
	pool := newPool(t, "berth-tx-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{PollInterval: 5 * time.Minute})
	ctx := testCtx(t)
	q := "tx_" + suffix()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+b.Schema()+`.orders (id text PRIMARY KEY, status text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	enqueue := func(order string, commit bool) *sdk.Message {
		t.Helper()
		m := &sdk.Message{Type: "billing.charge", Body: []byte(`{"order":"` + order + `"}`)}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+b.Schema()+`.orders VALUES ($1, 'pending')`, order); err != nil {
				return err
			}
			if err := b.PublishTx(ctx, tx, q, m); err != nil {
				return err
			}
			if !commit {
				return errRollback
			}
			return nil
		})
		if err != nil && !errors.Is(err, errRollback) {
			t.Fatalf("transaction: %v", err)
		}
		return m
	}
	enqueue("order_rolled_back", false)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+b.Schema()+`.jobs`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d jobs after a rolled-back enqueue (%v), want 0", n, err)
	}

	// A Receive waiting before the commit is woken by its NOTIFY; its poll
	// interval is 5 minutes.
	got := make(chan []sdk.Delivery, 1)
	errc := make(chan error, 1)
	go func() {
		ds, err := b.Receive(ctx, q, 10)
		got <- ds
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	committed := enqueue("order_committed", true)
	var ds []sdk.Delivery
	select {
	case ds = <-got:
		if err := <-errc; err != nil {
			t.Fatalf("Receive: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Receive not woken by the NOTIFY of a committed enqueue")
	}
	if len(ds) != 1 || ds[0].Message().ID != committed.ID {
		t.Fatalf("received %d deliveries, want only the committed job %s", len(ds), committed.ID)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	counts, err := b.CountByStatus(ctx, q)
	if err != nil || !maps1(counts, postgres.StatusCompleted) {
		t.Errorf("CountByStatus = %v, %v; want one completed job", counts, err)
	}
}

// TestPublishTxOnEndedTxNotUnavailable: a PublishTx on a transaction the
// caller already committed fails in pgx (pgx.ErrTxClosed), before anything
// reaches the server. The old classification took every error that was not
// a server error for a lost connection and wrapped sdk.ErrUnavailable, so a
// caller (the outbox relay, a retry loop) retried it forever as if the
// database were down. Now it is the error it is; and a real loss of the
// connection (the conformance edges) still wraps sdk.ErrUnavailable.
func TestPublishTxOnEndedTxNotUnavailable(t *testing.T) {
	pool := newPool(t, "berth-txended-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{})
	ctx := testCtx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = b.PublishTx(ctx, tx, "txended_"+suffix(), &sdk.Message{Body: []byte("x")})
	if !errors.Is(err, pgx.ErrTxClosed) || errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("PublishTx on a committed transaction: %v; want pgx.ErrTxClosed, not sdk.ErrUnavailable", err)
	}
}

var errRollback = errors.New("roll back")

func maps1(counts map[string]int64, status string) bool {
	return len(counts) == 1 && counts[status] == 1
}

// TestDedupeEnqueue: with DedupeEnqueue, a second publish of an idempotency
// key returns the existing job instead of inserting one.
func TestDedupeEnqueue(t *testing.T) {
	pool := newPool(t, "berth-dedupe-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{DedupeEnqueue: true})
	ctx := testCtx(t)
	q, other := "dedupe_"+suffix(), "dedupe_other_"+suffix()
	first := &sdk.Message{IdempotencyKey: "charge:order_1:v1", Body: []byte("first")}
	if err := b.Publish(ctx, q, first); err != nil {
		t.Fatal(err)
	}
	again := &sdk.Message{IdempotencyKey: "charge:order_1:v1", Body: []byte("again")}
	inBatch := []*sdk.Message{
		{IdempotencyKey: "charge:order_2:v1", Body: []byte("order 2")},
		{IdempotencyKey: "charge:order_2:v1", Body: []byte("order 2 again")},
		{Body: []byte("no key")}, {Body: []byte("no key")},
	}
	if err := b.Publish(ctx, q, append([]*sdk.Message{again}, inBatch...)...); err != nil {
		t.Fatal(err)
	}
	if again.ID != first.ID {
		t.Errorf("duplicate publish got ID %s, want the existing job's %s", again.ID, first.ID)
	}
	if inBatch[0].ID != inBatch[1].ID {
		t.Errorf("duplicates within a batch got IDs %s and %s, want one job", inBatch[0].ID, inBatch[1].ID)
	}
	// The same key on another queue is another job; in a transaction too.
	elsewhere := &sdk.Message{IdempotencyKey: "charge:order_1:v1"}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return b.PublishTx(ctx, tx, other, elsewhere) }); err != nil {
		t.Fatal(err)
	}
	if elsewhere.ID == first.ID {
		t.Error("the same key on another queue was deduplicated")
	}
	counts, _ := b.CountByStatus(ctx, q)
	if counts[postgres.StatusQueued] != 4 {
		t.Errorf("%d jobs queued, want 4 (order_1, order_2, two without key)", counts[postgres.StatusQueued])
	}
	// The key stays taken after the job completed.
	for _, d := range receiveN(t, b, q, 4) {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	late := &sdk.Message{IdempotencyKey: "charge:order_1:v1"}
	if err := b.Publish(ctx, q, late); err != nil || late.ID != first.ID {
		t.Errorf("publish after completion: ID %s, %v; want the completed job %s", late.ID, err, first.ID)
	}
}

// TestDedupeEnqueueSameIDInBatch: with DedupeEnqueue, two messages of one
// batch with the same ID are told apart: the first wins, and one whose key is
// already taken (by an earlier job or by an earlier message of the batch) is
// reported as a duplicate, its ID set to the existing job's, as across
// batches. Publish used to mark a message inserted by its ID, so the twin of
// an inserted message passed for inserted and kept its own ID.
func TestDedupeEnqueueSameIDInBatch(t *testing.T) {
	pool := newPool(t, "berth-dedupe-sameid-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{DedupeEnqueue: true})
	ctx := testCtx(t)
	q := "dedupe_sameid_" + suffix()
	old := &sdk.Message{IdempotencyKey: "old", Body: []byte("old")}
	if err := b.Publish(ctx, q, old); err != nil {
		t.Fatal(err)
	}
	batch := []*sdk.Message{
		{ID: "same-1", IdempotencyKey: "new-1", Body: []byte("new-1")}, // inserted
		{ID: "same-1", IdempotencyKey: "old", Body: []byte("dup old")}, // duplicate of old
		{ID: "same-2", IdempotencyKey: "old", Body: []byte("dup old")}, // duplicate of old
		{ID: "same-2", IdempotencyKey: "new-2", Body: []byte("new-2")}, // inserted
		{ID: "twin", IdempotencyKey: "twin", Body: []byte("twin 1")},   // inserted: the first wins
		{ID: "twin", IdempotencyKey: "twin", Body: []byte("twin 2")},   // duplicate of the first
	}
	if err := b.Publish(ctx, q, batch...); err != nil {
		t.Fatal(err)
	}
	want := []string{"same-1", old.ID, old.ID, "same-2", "twin", "twin"}
	for i, m := range batch {
		if m.ID != want[i] {
			t.Errorf("message %d (key %s) got ID %s, want %s", i, m.IdempotencyKey, m.ID, want[i])
		}
	}
	bodies := map[string]bool{}
	for _, d := range receiveN(t, b, q, 4) {
		bodies[string(d.Message().Body)] = true
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, body := range []string{"old", "new-1", "new-2", "twin 1"} {
		if !bodies[body] {
			t.Errorf("stored jobs %v, want %q among them", bodies, body)
		}
	}
	counts, err := b.CountByStatus(ctx, q)
	if err != nil || counts[postgres.StatusCompleted] != 4 || len(counts) != 1 {
		t.Errorf("CountByStatus = %v, %v; want 4 completed jobs only", counts, err)
	}
}

func TestDeleteCompleted(t *testing.T) {
	pool := newPool(t, "berth-retention-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{})
	ctx := testCtx(t)
	q := "retention_" + suffix()
	publishN(t, b, q, 7)
	ds := receiveN(t, b, q, 7)
	for _, d := range ds[:5] {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := b.DeleteCompleted(ctx, time.Hour, 2); err != nil || n != 0 {
		t.Errorf("DeleteCompleted(older than 1h) = %d, %v; want 0", n, err)
	}
	if n, err := b.DeleteCompleted(ctx, 0, 2); err != nil || n != 5 {
		t.Errorf("DeleteCompleted(0, batch 2) = %d, %v; want 5", n, err)
	}
	counts, _ := b.CountByStatus(ctx, q)
	if len(counts) != 1 || counts[postgres.StatusProcessing] != 2 {
		t.Errorf("after retention: %v, want the 2 unsettled jobs only", counts)
	}

	// The broker's own retention loop.
	looped := newBroker(t, pool, postgres.Options{Retention: time.Millisecond, RetentionInterval: 20 * time.Millisecond,
		RetentionBatch: 3, Schema: b.Schema()})
	for _, d := range ds[5:] {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for {
		counts, err := looped.CountByStatus(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(counts) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("retention loop left %v", counts)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func publishN(t *testing.T, b *postgres.Broker, q string, n int) []string {
	t.Helper()
	msgs := make([]*sdk.Message, n)
	ids := make([]string, n)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "test", Body: []byte(`{"i":1}`)}
	}
	if err := b.Publish(context.Background(), q, msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

// TestNULBytesRefused: PostgreSQL text cannot hold NUL; such messages get a
// typed error instead of a database error.
func TestNULBytesRefused(t *testing.T) {
	pool := newPool(t, "berth-nul-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{})
	ctx := testCtx(t)
	if err := b.Publish(ctx, "q", &sdk.Message{Headers: map[string]string{"x": "a\x00b"}}); !errors.Is(err, sdk.ErrInvalidHeader) {
		t.Errorf("NUL in a header: %v, want ErrInvalidHeader", err)
	}
	if err := b.Publish(ctx, "q", &sdk.Message{Type: "a\x00b"}); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("NUL in Type: %v, want ErrInvalidMessage", err)
	}
	// NUL in the body is fine: it is bytea.
	body := []byte{0, 1, 0}
	if err := b.Publish(ctx, "q", &sdk.Message{Body: body}); err != nil {
		t.Fatalf("NUL in the body: %v", err)
	}
	ds := receiveN(t, b, "q", 1)
	if string(ds[0].Message().Body) != string(body) {
		t.Errorf("body %x, want %x", ds[0].Message().Body, body)
	}
	// A NUL in a dead-letter cause is dropped, not an error.
	if err := ds[0].DeadLetter(ctx, errors.New("bad\x00cause")); err != nil {
		t.Errorf("DeadLetter with a NUL in the cause: %v", err)
	}
}

// TestPollingOnly: with DisableListen the broker holds no LISTEN connection
// and Receive still finds new jobs by polling.
func TestPollingOnly(t *testing.T) {
	appName := "berth-poll-" + suffix()
	pool := newPool(t, appName, 2)
	b := newBroker(t, pool, postgres.Options{DisableListen: true, PollInterval: 50 * time.Millisecond})
	ctx := testCtx(t)
	q := "poll_" + suffix()
	got := make(chan int, 1)
	go func() {
		ds, err := b.Receive(ctx, q, 5)
		if err != nil {
			t.Errorf("Receive: %v", err)
		}
		got <- len(ds)
	}()
	time.Sleep(100 * time.Millisecond)
	publishN(t, b, q, 1)
	if n := <-got; n != 1 {
		t.Errorf("Receive returned %d deliveries, want 1", n)
	}
	var listening int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query ILIKE 'LISTEN%'`,
		appName).Scan(&listening); err != nil || listening != 0 {
		t.Errorf("%d LISTEN connections (%v) with DisableListen, want 0", listening, err)
	}
}

// TestRedriveInSQL: redrive resets attempt_count, keeps last_error for the
// record and counts every redrive in berth-redrive-count.
func TestRedriveInSQL(t *testing.T) {
	pool := newPool(t, "berth-redrive-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{})
	ctx := testCtx(t)
	q := "redrive_" + suffix()
	id := publishN(t, b, q, 1)[0]
	for round := 1; round <= 2; round++ {
		d := receiveN(t, b, q, 1)[0]
		if err := d.Retry(ctx, 0, errors.New("transient")); err != nil {
			t.Fatal(err)
		}
		d = receiveN(t, b, q, 1)[0]
		if d.Attempt() != 2 {
			t.Fatalf("round %d: Attempt() = %d, want 2", round, d.Attempt())
		}
		if err := d.DeadLetter(ctx, errors.New("gave up")); err != nil {
			t.Fatal(err)
		}
		if n, err := b.RedriveDeadLetters(ctx, q, id); err != nil || n != 1 {
			t.Fatalf("round %d: RedriveDeadLetters = %d, %v", round, n, err)
		}
		var (
			status, lastErr, count string
			attempts               int
			dlqHeaders             bool
		)
		if err := pool.QueryRow(ctx, `SELECT status, attempt_count, last_error, headers->>$2, headers ? $3
			FROM `+b.Schema()+`.jobs WHERE message_id = $1`, id, sdk.HeaderRedriveCount, sdk.HeaderDeadLetterReason).
			Scan(&status, &attempts, &lastErr, &count, &dlqHeaders); err != nil {
			t.Fatal(err)
		}
		if status != postgres.StatusQueued || attempts != 0 || lastErr != "gave up" || count != strconv.Itoa(round) || dlqHeaders {
			t.Errorf("round %d: row %s, attempt_count %d, last_error %q, redrive count %q, reason header %v",
				round, status, attempts, lastErr, count, dlqHeaders)
		}
	}
	if n, err := b.PurgeDeadLetters(ctx, q); err != nil || n != 0 {
		t.Errorf("PurgeDeadLetters of an empty DLQ = %d, %v", n, err)
	}
}

// TestPoisonDeadLetteredAtClaim: a job claimed max_attempts times without
// being settled is dead-lettered by the next claim, in SQL terms.
func TestPoisonDeadLetteredAtClaim(t *testing.T) {
	pool := newPool(t, "berth-poison-"+suffix(), 2)
	const lease = 200 * time.Millisecond
	b := newBroker(t, pool, postgres.Options{MaxAttempts: 2, Lease: lease, PollInterval: 50 * time.Millisecond})
	ctx := testCtx(t)
	q := "poison_" + suffix()
	id := publishN(t, b, q, 1)[0]
	for attempt := 1; attempt <= 2; attempt++ {
		if d := receiveN(t, b, q, 1)[0]; d.Attempt() != attempt {
			t.Fatalf("Attempt() = %d, want %d", d.Attempt(), attempt)
		} // never settled: the worker "dies"
	}
	receiveUntilDeadLettered(t, b, pool, q, id, lease)
	var (
		status, lastErr, class string
		attempts               int
	)
	if err := pool.QueryRow(ctx, `SELECT status, last_error, headers->>$2, attempt_count FROM `+b.Schema()+`.jobs
		WHERE message_id = $1`, id, sdk.HeaderDeadLetterClass).Scan(&status, &lastErr, &class, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != postgres.StatusDeadLetter || lastErr != sdk.ErrMaxDeliveries.Error() || class != string(sdk.ClassPoison) || attempts != 2 {
		t.Errorf("poison row: %s, last_error %q, class %q, attempt_count %d", status, lastErr, class, attempts)
	}
	st, err := b.Stats(ctx, q)
	if err != nil || st.DeadLettered != 1 || st.Ready+st.InFlight+st.Delayed != 0 {
		t.Errorf("Stats = %+v, %v; want one dead letter only", st, err)
	}
}
