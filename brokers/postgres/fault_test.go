package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

const helperEnv = "BERTH_PG_HELPER"

// helperProcess is the worker process the fault tests start and SIGKILL,
// run by TestMain instead of the tests when helperEnv is set. Role "hold"
// claims BERTH_PG_COUNT jobs, prints CLAIMED and holds them, never settling,
// until it is killed. Role "ackheld" is ackHeldProcess.
func helperProcess() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("BERTH_POSTGRES_DSN"))
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	lease, _ := time.ParseDuration(os.Getenv("BERTH_PG_LEASE"))
	b, err := postgres.New(pool, postgres.Options{Schema: os.Getenv("BERTH_PG_SCHEMA"), Lease: lease,
		WorkerID: "child-" + strconv.Itoa(os.Getpid())})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	n, _ := strconv.Atoi(os.Getenv("BERTH_PG_COUNT"))
	if os.Getenv(helperEnv) == "ackheld" {
		ackHeldProcess(ctx, b, n)
	}
	var held []string
	for len(held) < n {
		ds, err := b.Receive(ctx, os.Getenv("BERTH_PG_QUEUE"), n-len(held))
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(2)
		}
		for _, d := range ds {
			held = append(held, d.Message().ID)
		}
	}
	fmt.Println("CLAIMED " + strings.Join(held, " "))
	time.Sleep(time.Hour) // hold the leases until SIGKILL
	os.Exit(3)
}

// faultQueue is the parent side of the SIGKILL tests: a pool and broker
// of their own (worker "parent", a one-minute lease) and a fresh queue
// named prefix_… holding total published jobs, whose IDs it returns.
func faultQueue(t *testing.T, prefix string, total int) (*pgxpool.Pool, *postgres.Broker, context.Context, string, []string) {
	t.Helper()
	pool := newPool(t, "berth-"+prefix+"-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{WorkerID: "parent", Lease: time.Minute})
	q := prefix + "_" + suffix()
	return pool, b, testCtx(t), q, publishN(t, b, q, total)
}

// killChildAt starts this test binary as the helper process mode (the
// fault-test children above) on queue, with count jobs to take and a 1s
// lease, waits for its line "<marker> id id ...", SIGKILLs it there and
// returns the IDs it printed.
func killChildAt(t *testing.T, mode, schema, queue string, count int, marker string) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "BERTH_POSTGRES_DSN="+integration.PostgresDSN(t),
		"BERTH_PG_SCHEMA="+schema, "BERTH_PG_QUEUE="+queue, "BERTH_PG_COUNT="+strconv.Itoa(count), "BERTH_PG_LEASE=1s")
	cmd.Stderr = os.Stderr
	child, lines := integration.StartChildLines(t, cmd) // it sleeps an hour: not beyond this test
	var ids []string
	timeout := time.After(30 * time.Second)
scan:
	for {
		select {
		case l, ok := <-lines:
			if !ok { // the child exited: ids stays nil
				break scan
			}
			if rest, ok := strings.CutPrefix(l, marker+" "); ok {
				ids = strings.Fields(rest)
				break scan
			}
			t.Logf("child: %s", l)
		case <-timeout:
			t.Fatalf("child %s never printed %s", mode, marker)
		}
	}
	if err := child.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	return ids
}

// TestKilledWorkerJobsReclaimed: a worker process SIGKILLed while it holds
// leased rows; after the lease the rows are claimed again with the attempt
// counted, and every job is completed once.
func TestKilledWorkerJobsReclaimed(t *testing.T) {
	const total, held = 20, 8
	pool, b, ctx, q, ids := faultQueue(t, "kill", total)
	childIDs := killChildAt(t, "hold", b.Schema(), q, held, "CLAIMED")
	if len(childIDs) != held {
		t.Fatalf("child claimed %d jobs, want %d", len(childIDs), held)
	}
	var processing int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+b.Schema()+`.jobs
		WHERE queue = $1 AND status = 'processing' AND worker_id LIKE 'child-%' AND attempt_count = 1`, q).Scan(&processing); err != nil {
		t.Fatal(err)
	}
	if processing != held {
		t.Fatalf("%d rows leased by the dead child, want %d", processing, held)
	}

	attempts := map[string]int{}
	for len(attempts) < total {
		for _, d := range receiveN(t, b, q, 1) {
			if _, dup := attempts[d.Message().ID]; dup {
				t.Errorf("job %s delivered again after its ack", d.Message().ID)
			}
			attempts[d.Message().ID] = d.Attempt()
			if err := d.Ack(ctx); err != nil {
				t.Fatalf("Ack: %v", err)
			}
		}
	}
	isChild := map[string]bool{}
	for _, id := range childIDs {
		isChild[id] = true
	}
	for _, id := range ids {
		want := 1
		if isChild[id] {
			want = 2 // the dead child's claim counted
		}
		if attempts[id] != want {
			t.Errorf("job %s: Attempt() = %d, want %d", id, attempts[id], want)
		}
	}
	counts, err := b.CountByStatus(ctx, q)
	if err != nil || len(counts) != 1 || counts[postgres.StatusCompleted] != total {
		t.Errorf("CountByStatus = %v, %v; want %d completed", counts, err, total)
	}
}

// TestTerminatedConnectionsRecover kills every connection of the worker's
// pool (and the broker's LISTEN connection) twice with pg_terminate_backend
// in the middle of a run: nothing is lost, nothing is dead-lettered, the
// Worker finishes the queue and the listener comes back.
func TestTerminatedConnectionsRecover(t *testing.T) {
	appName := "berth-term-" + suffix()
	pool := newPool(t, appName, 6)
	admin := newPool(t, "berth-term-admin", 2)
	quiet := slog.New(slog.DiscardHandler)
	b := newBroker(t, pool, postgres.Options{Lease: 2 * time.Second, MaxAttempts: 20,
		PollInterval: 200 * time.Millisecond, Logger: quiet})
	ctx := testCtx(t)
	q := "term_" + suffix()
	const n = 600
	ids := publishN(t, b, q, n)

	var (
		mu      sync.Mutex
		effects = map[string]int{}
		handled int
		marks   = map[int]chan struct{}{n / 4: make(chan struct{}), n / 2: make(chan struct{})}
	)
	handler := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		time.Sleep(time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		effects[d.Message().ID]++
		handled++
		if ch, ok := marks[handled]; ok {
			close(ch)
		}
		return nil
	})
	w, err := sdk.NewWorker(b, handler, sdk.WorkerOptions{Queue: q, Concurrency: 8, Lease: 2 * time.Second,
		Retry: sdk.RetryPolicy{MaxAttempts: 20}, DrainTimeout: 10 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-runErr; err != nil {
			t.Errorf("Worker.Run: %v", err)
		}
	}()

	terminate := func() int {
		var killed int
		if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&killed); err != nil {
			t.Fatalf("pg_terminate_backend: %v", err)
		}
		return killed
	}
	for _, at := range []int{n / 4, n / 2} {
		select {
		case <-marks[at]:
		case <-ctx.Done():
			t.Fatalf("the worker never handled %d jobs", at)
		}
		// The pool may hold no connection at this instant: the last
		// termination's replacements are dialled on demand, and in one CI run
		// the 300th job was handled (from deliveries claimed before) while
		// none was back. Try again until one is.
		killed := terminate()
		for deadline := time.Now().Add(10 * time.Second); killed == 0 && time.Now().Before(deadline); killed = terminate() {
			time.Sleep(5 * time.Millisecond)
		}
		if killed == 0 {
			t.Errorf("no connection of %s to terminate after %d jobs", appName, at)
		}
		t.Logf("after %d jobs: terminated %d connections", at, killed)
	}

	for {
		counts, err := b.CountByStatus(ctx, q)
		if err != nil && ctx.Err() != nil {
			t.Fatalf("jobs never all completed: %v", err)
		}
		if counts[postgres.StatusCompleted] == n {
			break
		}
		if counts[postgres.StatusDeadLetter] > 0 {
			t.Fatalf("jobs dead-lettered after connection loss: %v", counts)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("jobs never all completed: %v", counts)
		case <-time.After(50 * time.Millisecond):
		}
	}
	mu.Lock()
	again := 0
	for _, id := range ids {
		if effects[id] == 0 {
			t.Errorf("job %s completed but never handled", id)
		}
		if effects[id] > 1 {
			again++
		}
	}
	mu.Unlock()
	t.Logf("%d jobs completed; %d handled more than once (their ack was lost with its connection)", n, again)

	// The LISTEN connection came back: a job published now is received
	// through NOTIFY as before.
	for {
		var listening int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND query ILIKE 'LISTEN%'`, appName).Scan(&listening); err != nil {
			t.Fatal(err)
		}
		if listening > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the LISTEN connection never came back")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ackHeldProcess runs a Worker (Concurrency 4, Prefetch 4: 8 slots) whose
// handler succeeds, on a broker whose acker is held: the acks are made and
// wait for their group commit, which never comes. Once n acks are pending it
// prints ACKPENDING and the handled IDs, and waits to be killed.
func ackHeldProcess(ctx context.Context, b *postgres.Broker, n int) {
	_ = b.HoldAcks() // never released: the process dies first
	var mu sync.Mutex
	var handled []string
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		mu.Lock()
		handled = append(handled, d.Message().ID)
		mu.Unlock()
		return nil
	}), sdk.WorkerOptions{Queue: os.Getenv("BERTH_PG_QUEUE"), Concurrency: 4, Prefetch: 4,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	go func() { _ = w.Run(ctx) }() // killed, never stopped
	for b.PendingAcks() < n {
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	fmt.Println("ACKPENDING " + strings.Join(handled, " "))
	mu.Unlock()
	time.Sleep(time.Hour)
	os.Exit(3)
}

// TestKilledBeforeAckBatchCommits: a Worker process whose jobs succeeded and
// whose acks wait for their batch is SIGKILLed before the batch is written.
// Nothing was completed, and every one of those jobs is delivered again after
// its lease (Attempt 2): an ack that never committed means a redelivery,
// never a lost job. The other jobs are untouched.
func TestKilledBeforeAckBatchCommits(t *testing.T) {
	const total, slots = 20, 8
	_, b, ctx, q, ids := faultQueue(t, "ackkill", total)
	acked := killChildAt(t, "ackheld", b.Schema(), q, slots, "ACKPENDING")
	if len(acked) != slots {
		t.Fatalf("child handled %d jobs, want %d (its slots, all held by pending acks)", len(acked), slots)
	}
	counts, err := b.CountByStatus(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if counts[postgres.StatusCompleted] != 0 || counts[postgres.StatusProcessing] != slots {
		t.Fatalf("after the kill: %v, want %d processing and none completed (no batch was written)", counts, slots)
	}

	attempts := map[string]int{}
	for len(attempts) < total {
		for _, d := range receiveN(t, b, q, 1) {
			if _, dup := attempts[d.Message().ID]; dup {
				t.Errorf("job %s delivered again after its ack", d.Message().ID)
			}
			attempts[d.Message().ID] = d.Attempt()
			if err := d.Ack(ctx); err != nil {
				t.Fatalf("Ack: %v", err)
			}
		}
	}
	wasAcked := map[string]bool{}
	for _, id := range acked {
		wasAcked[id] = true
	}
	for _, id := range ids {
		want := 1
		if wasAcked[id] {
			want = 2 // handled and acked by the child, but its ack never committed
		}
		if attempts[id] != want {
			t.Errorf("job %s: Attempt() = %d, want %d", id, attempts[id], want)
		}
	}
	counts, err = b.CountByStatus(ctx, q)
	if err != nil || len(counts) != 1 || counts[postgres.StatusCompleted] != total {
		t.Errorf("CountByStatus = %v, %v; want %d completed", counts, err, total)
	}
}

// TestClaimCutKeepsJobs (issue 15): a Receive whose caller goes away while
// its claim is on the wire — the server has run the claim, its reply is
// still held by the fault proxy — neither loses the claimed jobs nor
// strands them leased to nobody. Receive returns ctx's error with nothing,
// and from the database: no row is left 'processing', no attempt counted;
// the next Receive gets every job at Attempt() 1. Before the fix (commit
// 73c2697) pgx cut the claim's connection when ctx ended and the rows stayed
// leased for the whole lease, their attempt counted: what rolling SIGTERMs
// showed as charges committed at attempt 2 (RELIABILITY.md).
func TestClaimCutKeepsJobs(t *testing.T) {
	cfg, proxy := proxiedConfig(t)
	// One connection, on which the claim statement gets prepared before the
	// replies are held, and no liveness ping on acquire: either would wait
	// for a held reply, and the claim would never be sent.
	cfg.MaxConns = 1
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	ctx := testCtx(t)
	proxied, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	admin := newPool(t, "berth-cut-admin-"+suffix(), 2) // straight to the server
	// A lease far longer than the test: a stranded row cannot come back
	// by expiring while the test looks.
	b := newBroker(t, proxied, postgres.Options{Lease: 10 * time.Minute, PollInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	q := "cut_" + suffix()
	wctx, wc := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := b.Receive(wctx, q+"_warm", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("warm-up Receive on an empty queue: %v", err)
	}
	wc()
	const n = 5
	ids := publishN(t, b, q, n)

	proxy.FreezeReplies()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		ds  []sdk.Delivery
		err error
	}
	done := make(chan result, 1)
	go func() {
		ds, err := b.Receive(rctx, q, n)
		done <- result{ds, err}
	}()
	// The claim has run on the server once its rows are leased.
	for {
		var leased int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+b.Schema()+`.jobs WHERE queue = $1 AND status = 'processing'`, q).Scan(&leased); err != nil {
			t.Fatal(err)
		}
		if leased == n {
			break
		}
		select {
		case <-ctx.Done():
			proxy.Thaw()
			t.Fatalf("the claim never ran (%d of %d rows leased)", leased, n)
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel() // the caller goes away with the reply still held
	var r result
	got := false
	select {
	case r = <-done: // cut at once
		got = true
	case <-time.After(time.Second): // waits for the claim's reply
	}
	proxy.Thaw()
	if !got {
		r = <-done
	}
	if !errors.Is(r.err, context.Canceled) || len(r.ds) != 0 {
		t.Fatalf("Receive after its caller went away: %d deliveries, %v; want none and context.Canceled", len(r.ds), r.err)
	}

	var leased, counted, total int
	if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'processing'), count(*) FILTER (WHERE attempt_count > 0), count(*)
		FROM `+b.Schema()+`.jobs WHERE queue = $1`, q).Scan(&leased, &counted, &total); err != nil {
		t.Fatal(err)
	}
	if total != n || leased != 0 || counted != 0 {
		t.Fatalf("after the cut claim: %d jobs, %d still leased to the gone caller, %d with an attempt counted; want %d, 0, 0",
			total, leased, counted, n)
	}
	seen := map[string]bool{}
	for _, d := range receiveN(t, b, q, n) {
		seen[d.Message().ID] = true
		if d.Attempt() != 1 {
			t.Errorf("job %s: Attempt() = %d after the cut claim, want 1", d.Message().ID, d.Attempt())
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("job %s lost", id)
		}
	}
}
