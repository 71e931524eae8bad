package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// End to end on the PostgreSQL broker with the sdk.Worker: the jobs table,
// job_results and the handler's effects in one database.

const workerLease = time.Second

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newBroker(t testing.TB, e *env) *postgres.Broker {
	t.Helper()
	b, err := postgres.New(e.pool, postgres.Options{Schema: e.schema, Lease: workerLease, PollInterval: 100 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Migrate(context.Background()); err != nil {
		_ = b.Close()
		t.Fatal(err)
	}
	return b
}

func newWorker(t testing.TB, sub sdk.Subscriber, h sdk.Handler, mw sdk.Middleware) *sdk.Worker {
	t.Helper()
	w, err := sdk.NewWorker(sub, h, sdk.WorkerOptions{
		Queue:       "billing",
		Concurrency: 4,
		Lease:       workerLease,
		Middleware:  []sdk.Middleware{mw},
		Retry:       sdk.RetryPolicy{Backoff: sdk.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond}},
		Logger:      quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// drain runs w until the queue has nothing ready, delayed or in flight.
func drain(t *testing.T, b *postgres.Broker, w *sdk.Worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("worker: %v", err)
		}
	}()
	waitFor(t, func() bool {
		s, err := b.Stats(context.Background(), "billing")
		if err != nil {
			t.Fatal(err)
		}
		return s.Ready+s.Delayed+s.InFlight == 0
	})
}

// Same key, different payload, through the broker: the second job lands in
// the dead-letter queue with the conflict as its reason.
func TestWorkerOnPostgresBrokerConflict(t *testing.T) {
	e := newEnv(t)
	b := newBroker(t, e)
	defer b.Close()
	var stats idempotency.Stats
	mw, err := idempotency.Middleware(idempotency.Options{Store: e.store, Stats: &stats, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	key := "charge:order_" + randSuffix() + ":v1"
	if err := b.Publish(context.Background(), "billing", chargeMsg(key, `{"amount":100}`), chargeMsg(key, `{"amount":100}`)); err != nil {
		t.Fatal(err)
	}
	drain(t, b, newWorker(t, b, effectHandler(e, "w", nil), mw))
	conflict := chargeMsg(key, `{"amount":999}`) // the key again, once completed, with another payload
	if err := b.Publish(context.Background(), "billing", conflict); err != nil {
		t.Fatal(err)
	}
	drain(t, b, newWorker(t, b, effectHandler(e, "w", nil), mw))

	if got := e.effectCount(t, key); got != 1 {
		t.Fatalf("effect count = %d, want 1", got)
	}
	dead, err := b.ListDeadLetters(context.Background(), "billing", 10)
	if err != nil {
		t.Fatal(err)
	}
	// The reason names the key by its digest (Options.LogKeys unset).
	want := `permanent: idempotency: key_sha256 ` + idempotency.KeyDigest(key) +
		` reused with a different payload (job type "billing.charge", stored for "billing.charge")`
	if len(dead) != 1 || dead[0].ID != conflict.ID || dead[0].Header(sdk.HeaderDeadLetterReason) != want ||
		dead[0].Header(sdk.HeaderDeadLetterClass) != string(sdk.ClassPermanent) {
		t.Fatalf("dead letters = %+v, want the conflicting job with reason %q", dead, want)
	}
	if s := stats.Snapshot(); s.KeyConflicts != 1 || s.Executed != 1 || s.DuplicatesSuppressed != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

// haltingSubscriber stops the child worker dead at a chosen point: its
// deliveries' Ack prints ACKING and blocks until the process is killed.
type haltingSubscriber struct{ sdk.Subscriber }

func (s haltingSubscriber) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	ds, err := s.Subscriber.Receive(ctx, queue, max)
	for i, d := range ds {
		ds[i] = haltingDelivery{d}
	}
	return ds, err
}

type haltingDelivery struct{ sdk.Delivery }

func (d haltingDelivery) Ack(context.Context) error {
	fmt.Println("ACKING")
	select {} // killed here: committed, not acked
}

// workerChild is the child of TestWorkerCrash: a Worker on the PostgreSQL
// broker that is SIGKILLed before its commit or after it.
func workerChild(role string, e *env) {
	b, err := postgres.New(e.pool, postgres.Options{Schema: e.schema, Lease: workerLease, PollInterval: 100 * time.Millisecond, Logger: quiet})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(2)
	}
	mw, err := idempotency.Middleware(idempotency.Options{Store: e.store, Logger: quiet})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(2)
	}
	var gate func()
	if role == "worker-before-commit" {
		gate = func() {
			fmt.Println("WROTE")
			select {} // killed here, the transaction open
		}
	}
	w, err := sdk.NewWorker(haltingSubscriber{b}, effectHandler(e, "child", gate), sdk.WorkerOptions{Queue: "billing", Lease: workerLease, Middleware: []sdk.Middleware{mw}, Logger: quiet})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(2)
	}
	err = w.Run(context.Background())
	fmt.Println("ERR worker returned", err)
	os.Exit(2)
}

// A Worker process on the PostgreSQL broker is SIGKILLed after its commit and
// before its ack (the redelivery acks without running the handler), or
// before its commit (the redelivery runs it once). The effect count in the
// database is 1 either way.
func TestWorkerCrash(t *testing.T) {
	for _, tc := range []struct {
		role, marker string
		wantRuns     int
	}{{"worker-after-commit", "ACKING", 0}, {"worker-before-commit", "WROTE", 1}} {
		t.Run(tc.role, func(t *testing.T) {
			e := newEnv(t)
			b := newBroker(t, e)
			defer b.Close()
			key := "charge:order_" + randSuffix() + ":v1"
			if err := b.Publish(context.Background(), "billing", chargeMsg(key, `{"order":"o1"}`)); err != nil {
				t.Fatal(err)
			}
			killChildAt(t, e, tc.role, tc.marker, key)

			var stats idempotency.Stats
			mw, err := idempotency.Middleware(idempotency.Options{Store: e.store, Stats: &stats, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			var runs, attempt atomic.Int32
			h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
				attempt.Store(int32(d.Attempt()))
				return effectHandler(e, "parent", func() { runs.Add(1) }).Handle(ctx, d)
			})
			// The job comes back once the dead worker's lease expires.
			drain(t, b, newWorker(t, b, h, mw))
			if int(runs.Load()) != tc.wantRuns {
				t.Fatalf("the redelivery ran the handler %d times, want %d", runs.Load(), tc.wantRuns)
			}
			if got := e.effectCount(t, key); got != 1 {
				t.Fatalf("effect count in the database = %d, want 1", got)
			}
			if tc.wantRuns == 1 && attempt.Load() != 2 {
				t.Fatalf("redelivery attempt = %d, want 2 (the crash counts)", attempt.Load())
			}
			if s := stats.Snapshot(); tc.wantRuns == 0 && s.DuplicatesSuppressed != 1 {
				t.Fatalf("stats = %+v, want the redelivery suppressed", s)
			}
		})
	}
}

func killChildAt(t *testing.T, e *env, role, marker, key string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"="+role, envSchema+"="+e.schema, envKey+"="+key, "BERTH_POSTGRES_DSN="+e.dsn)
	// The child blocks forever at its marker, the "before-commit" one
	// inside its open transaction (row locks held, its Worker extending the
	// lease): it must not outlive this test, nor this process if it dies
	// (a -timeout panic runs no cleanup).
	child, lines := integration.StartChildLines(t, cmd)
	// A child that never reaches its marker is killed, which ends the lines.
	stuck := time.AfterFunc(time.Minute, func() { _ = cmd.Process.Kill() })
	defer stuck.Stop()
	seen := false
	for line := range lines {
		if strings.HasPrefix(line, "ERR") {
			t.Fatalf("child: %s", line)
		}
		if line == marker {
			seen = true
			break
		}
	}
	if !seen {
		t.Fatalf("child exited before %s", marker)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
}
