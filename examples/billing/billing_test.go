package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
