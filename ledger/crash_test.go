package ledger_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// The child process of TestCrashedWorkerRabbitMQ reads its parameters from
// these variables.
const (
	helperEnv    = "BERTH_LEDGER_HELPER"
	helperURL    = "BERTH_LEDGER_HELPER_URL"
	helperDSN    = "BERTH_LEDGER_HELPER_DSN"
	helperQueue  = "BERTH_LEDGER_HELPER_QUEUE"
	helperSchema = "BERTH_LEDGER_HELPER_SCHEMA"
)

// helperProcess is the child: a Worker with a ledger that starts the job,
// makes sure the start is written, says so and hangs until it is killed.
func helperProcess() {
	fail := func(err error) {
		fmt.Println("ERROR", strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(helperDSN))
	if err != nil {
		fail(err)
	}
	store, err := pgledger.New(pool, pgledger.Options{Schema: os.Getenv(helperSchema)})
	if err != nil {
		fail(err)
	}
	l, err := ledger.New(ledger.Options{Store: store, WorkerID: "child-" + strconv.Itoa(os.Getpid()), Logger: quiet})
	if err != nil {
		fail(err)
	}
	b, err := rabbitmq.New(ctx, os.Getenv(helperURL), rabbitmq.Options{Logger: quiet})
	if err != nil {
		fail(err)
	}
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if err := l.Flush(ctx); err != nil {
			fail(err)
		}
		fmt.Println("STARTED", d.Message().ID, d.Attempt(), l.WorkerID())
		select {} // until SIGKILL
	})
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: os.Getenv(helperQueue), Concurrency: 1, Prefetch: 1,
		Observers: []sdk.Observer{l}, Logger: quiet})
	if err != nil {
		fail(err)
	}
	fail(fmt.Errorf("worker returned: %v", w.Run(ctx)))
}

// TestCrashedWorkerRabbitMQ SIGKILLs a worker process in the middle of a
// job (on RabbitMQ; the ledger's side is the same on every broker): the
// job's history shows the crashed attempt, never settled, abandoned, and
// the attempt that then succeeded in this process.
func TestCrashedWorkerRabbitMQ(t *testing.T) {
	e := rabbitEnv(t)
	store := e.reader.(*pgledger.Store)
	ctx := testCtx(t, 60*time.Second)
	m := &sdk.Message{Type: "ledger.crash", Body: []byte(`{}`)}
	if err := e.publisher().Publish(ctx, e.queue, m); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=worker", helperURL+"="+integration.RabbitMQURL(t),
		helperDSN+"="+integration.PostgresDSN(t), helperQueue+"="+e.queue, helperSchema+"="+schemaOf(t, store))
	cmd.Stderr = os.Stderr
	// The child hangs in its handler until killed: not beyond this test
	// (a t.Fatal before the SIGKILL below), nor beyond this process.
	child, lines := integration.StartChildLines(t, cmd)
	var worker string // the child's ledger worker ID
	select {
	case l := <-lines:
		f := strings.Fields(l)
		if len(f) != 4 || f[0] != "STARTED" || f[1] != m.ID || f[2] != "1" {
			t.Fatalf("child said %q, want STARTED %s 1 <worker>", f, m.ID)
		}
		worker = f[3]
	case <-ctx.Done():
		t.Fatal("the child never started the job")
	}
	j := waitJob(t, ctx, store, m.ID, "running in the child", func(j *ledger.Job) bool { return j.Status == ledger.StatusRunning })
	if j.Worker != worker || j.Attempts != 1 {
		t.Errorf("running job: worker %q attempt %d, want %q 1", j.Worker, j.Attempts, worker)
	}
	if err := child.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()

	startWorker(t, e, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{})
	j = waitJob(t, ctx, store, m.ID, "succeeded after the crash", func(j *ledger.Job) bool { return j.Status == ledger.StatusSucceeded })
	if j.Attempts != 2 || j.Worker != e.led.WorkerID() {
		t.Errorf("job: attempts %d worker %q, want 2 and %q", j.Attempts, j.Worker, e.led.WorkerID())
	}
	if len(j.History) != 2 {
		t.Fatalf("history %+v, want the crashed attempt and the one that succeeded", j.History)
	}
	crashed, ok := j.History[0], j.History[1]
	if crashed.Attempt != 1 || crashed.Status != ledger.StatusRunning || !crashed.Abandoned || crashed.Worker != worker ||
		crashed.StartedAt.IsZero() || !crashed.FinishedAt.IsZero() {
		t.Errorf("crashed attempt %+v: want attempt 1, running, abandoned, by %s, started, never finished", crashed, worker)
	}
	if ok.Attempt != 2 || ok.Status != ledger.StatusSucceeded || ok.Abandoned || ok.Worker != e.led.WorkerID() {
		t.Errorf("second attempt %+v: want attempt 2 succeeded by %s", ok, e.led.WorkerID())
	}
}

// schemaOf returns the schema of s's tables.
func schemaOf(t *testing.T, s *pgledger.Store) string {
	t.Helper()
	schema, _, ok := strings.Cut(strings.ReplaceAll(s.Table(), `"`, ""), ".")
	if !ok {
		t.Fatalf("table %s", s.Table())
	}
	return schema
}
