package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/internal/demotest"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

// runMainEnv makes the test binary run the command's main instead of the
// tests (TestSIGTERMDropsSchema's child process).
const runMainEnv = "BERTH_BILLING_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// check asserts the scenario's promise: no order charged twice, every valid
// order charged, and exactly the poison job dead-lettered, as undecodable.
func check(t *testing.T, s *summary, out string) {
	t.Helper()
	if s.ChargedTwice != 0 {
		t.Errorf("%d orders charged twice", s.ChargedTwice)
	}
	if len(s.NotCharged) != 0 {
		t.Errorf("orders never charged: %v", s.NotCharged)
	}
	for id, n := range s.Charges {
		if n != 1 {
			t.Errorf("%s charged %d times", id, n)
		}
	}
	if len(s.DeadLetters) != 1 {
		t.Fatalf("dead letters = %+v, want only the poison job", s.DeadLetters)
	}
	d := s.DeadLetters[0]
	if d.Key != chargeKey("order_poison") || !errors.Is(d.Cause, sdk.ErrUndecodable) || !sdk.IsPermanent(d.Cause) {
		t.Fatalf("dead letter = %+v, want the poison job, permanent and undecodable", d)
	}
	if s.Acked != int64(s.Published-1) {
		t.Errorf("acked %d of %d jobs", s.Acked, s.Published-1)
	}
	if g := s.Guard; g.Executed != int64(s.Orders) || g.DuplicatesSuppressed < int64(s.Duplicates) {
		t.Errorf("guard stats %+v: want %d executed and at least %d duplicates suppressed", g, s.Orders, s.Duplicates)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if last := lines[len(lines)-1]; last != "orders charged twice:  0" {
		t.Errorf("summary ends with %q", last)
	}
}

func TestScenarioMemory(t *testing.T) {
	var out bytes.Buffer
	s, err := run(context.Background(), config{Seed: 42, FailRate: 0.2}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	check(t, s, out.String())
	if s.InjectedFailures == 0 || s.Retried < s.InjectedFailures {
		t.Errorf("injected %d failures, %d retries: the transient path was not exercised", s.InjectedFailures, s.Retried)
	}
}

// Lost acks (a worker killed between commit and ack) come back after the
// lease and are acked without charging again.
func TestScenarioMemoryCrashAndLock(t *testing.T) {
	var out bytes.Buffer
	s, err := run(context.Background(), config{Seed: 7, FailRate: 0.2, Crash: true, Lock: true}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	check(t, s, out.String())
	if s.DroppedAcks == 0 {
		t.Fatal("no ack was lost: the crash path was not exercised")
	}
	if s.Guard.DuplicatesSuppressed < int64(s.Duplicates)+s.DroppedAcks {
		t.Errorf("duplicates suppressed %d < published twice %d + lost acks %d", s.Guard.DuplicatesSuppressed, s.Duplicates, s.DroppedAcks)
	}
}

// The PostgreSQL form: the jobs table broker, job_results, orders and
// charges in one database; charge counts come from the charges table.
func TestScenarioPostgres(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	var out bytes.Buffer
	s, err := run(context.Background(), config{Broker: "postgres", PostgresDSN: dsn, Seed: 3, FailRate: 0.2, Crash: true, Orders: 40}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	check(t, s, out.String())
}

func TestConfigRejected(t *testing.T) {
	for _, c := range []config{
		{Broker: "kafka"},
		{Broker: "postgres"},
		{Broker: "rabbitmq"},
		{Broker: "rabbitmq", RabbitMQURL: "amqp://x", Crash: true},
		{Broker: "sqs"},
		{FailRate: 1.5},
	} {
		if _, err := run(context.Background(), c, &bytes.Buffer{}); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

// The Redis cache in front of the PostgreSQL store answers duplicates; the
// charges stay at one per order.
func TestScenarioPostgresRedis(t *testing.T) {
	dsn, addr := integration.PostgresDSN(t), integration.RedisAddr(t)
	var out bytes.Buffer
	s, err := run(context.Background(), config{PostgresDSN: dsn, RedisAddr: addr, Seed: 5, FailRate: 0.2, Crash: true, Orders: 40}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	check(t, s, out.String())
	if s.Guard.CacheHits == 0 {
		t.Fatal("no duplicate was answered by the cache")
	}
}

// cancelOnLog is a slog.Handler that cancels a run's context, with its
// cause, at the first record the run logs (its Workers are then running).
type cancelOnLog struct {
	cancel context.CancelCauseFunc
	cause  error
}

func (h cancelOnLog) Enabled(context.Context, slog.Level) bool { return true }
func (h cancelOnLog) Handle(context.Context, slog.Record) error {
	h.cancel(h.cause)
	return nil
}
func (h cancelOnLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h cancelOnLog) WithGroup(string) slog.Handler      { return h }

// An interrupted run (Ctrl-C: main's context cancelled by the signal) says
// so, not that it ran out of -timeout.
func TestScenarioInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	interrupted := errors.New("interrupt signal received")
	var out bytes.Buffer
	_, err := run(ctx, config{Seed: 9, Orders: 200, Timeout: 10 * time.Minute, Logger: slog.New(cancelOnLog{cancel, interrupted})}, &out)
	if err == nil {
		t.Fatalf("an interrupted run returned no error\n%s", out.String())
	}
	if !strings.Contains(err.Error(), "interrupt signal received") || strings.Contains(err.Error(), "did not finish within") {
		t.Errorf("interrupted run: %v, want it to say it was interrupted", err)
	}
}

// TestSIGTERMDropsSchema: SIGTERM (kill, docker stop) while the scenario
// runs on PostgreSQL stops it as Ctrl-C does, with its schema dropped
// ("dropped at the end unless -keep"), instead of killing it with the schema
// and its jobs left behind.
func TestSIGTERMDropsSchema(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	// Enough orders that the scenario still runs when the signal comes.
	cmd := exec.Command(os.Args[0], "-broker", "postgres", "-postgres", dsn, "-orders", "20000", "-timeout", "10m")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	demotest.SignalDropsSchema(ctx, t, db, `^billing_[0-9a-f]{8}$`, cmd, syscall.SIGTERM, "terminated signal received")
}
