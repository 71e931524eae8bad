package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/integration"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "1" { // re-executed as a worker
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}

// The short form of the chaos command, as CI runs it: 15 seconds of faults
// per broker, then every invariant read from the database and the broker.
func TestChaosShort(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	for _, kind := range []string{"postgres", "rabbitmq", "sqs", "jetstream"} {
		t.Run(kind, func(t *testing.T) {
			c := config{Broker: kind, Duration: 15 * time.Second, Workers: 3, Rate: 20, PostgresDSN: dsn,
				Settle: 90 * time.Second, LogDir: t.TempDir()}
			switch kind {
			case "rabbitmq":
				c.RabbitMQURL = integration.RabbitMQURL(t)
			case "sqs":
				c.SQSEndpoint = integration.SQSEndpoint(t)
			case "jetstream":
				c.NATSURL = integration.NATSURL(t)
			}
			rep := runChaos(t, c)
			faults := 0
			for _, n := range rep.Faults {
				faults += n
			}
			if rep.Valid == 0 || rep.Poison == 0 || faults < 5 {
				t.Errorf("the run exercised too little: %d orders, %d poison, %d faults", rep.Valid, rep.Poison, faults)
			}
		})
	}
}

// Rolling SIGTERM of every worker process under load, again and again: 0
// lost, 0 charged twice, and no attempt consumed by a drain: no failure is
// injected, so every charge must commit at attempt 1, read from the charges
// table (see measure). PostgreSQL and RabbitMQ hand unstarted work back
// without counting it (sdk.Releaser); SQS counts every receive, so its
// Worker runs what it received and lets its long polls finish. JetStream
// counts every delivery too, but berth's Release stores a copy whose first
// delivery carries the released attempt before it acks the original, and a
// pull the drain cut gives back what the server still sends it the same
// way: a charge above attempt 1 would be a copy not stored, or a message
// the server delivered to a pull nobody read (see brokers/jetstream).
func TestRollingSIGTERM(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	for _, kind := range []string{"postgres", "rabbitmq", "sqs", "jetstream"} {
		t.Run(kind, func(t *testing.T) {
			// A 15 s lease, not the default 3 s: this test asserts that a drain
			// spends no attempt, and a lease lost to a 2 s stall of a loaded
			// machine would spend one. Nothing here waits for a lease to end.
			c := config{Broker: kind, Faults: "rolling", Duration: 15 * time.Second, Workers: 3, Rate: 80, PostgresDSN: dsn,
				Settle: 90 * time.Second, LogDir: t.TempDir(), Lease: 15 * time.Second}
			switch kind {
			case "rabbitmq":
				c.RabbitMQURL = integration.RabbitMQURL(t)
			case "sqs":
				c.SQSEndpoint = integration.SQSEndpoint(t)
			case "jetstream":
				c.NATSURL = integration.NATSURL(t)
			}
			rep := runChaos(t, c)
			if rep.Faults["worker SIGTERM (rolling)"] <= c.Workers {
				t.Errorf("%d rolling SIGTERMs, want every worker replaced, then more", rep.Faults["worker SIGTERM (rolling)"])
			}
			t.Logf("%s: %d charges committed above attempt 1 (max %d) in %d rolling SIGTERMs",
				kind, rep.LateCharges, rep.MaxAttempt, rep.Faults["worker SIGTERM (rolling)"])
		})
	}
}

// 200 ms per round trip (100 ms each way) on the broker and database paths,
// and a reset of one of them every 2–4 s: nothing valid dead-lettered,
// nothing charged twice or lost, and — where there are leases — no lease
// lost with heartbeats on.
func TestSlowLossyNetwork(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	for _, kind := range []string{"postgres", "rabbitmq", "sqs", "jetstream"} {
		t.Run(kind, func(t *testing.T) {
			c := config{Broker: kind, Faults: "slow", Duration: 10 * time.Second, Workers: 3, Rate: 10, PostgresDSN: dsn,
				Settle: 90 * time.Second, LogDir: t.TempDir()}
			switch kind {
			case "rabbitmq":
				c.RabbitMQURL = integration.RabbitMQURL(t)
			case "sqs":
				c.SQSEndpoint = integration.SQSEndpoint(t)
			case "jetstream":
				c.NATSURL = integration.NATSURL(t)
			}
			rep := runChaos(t, c)
			if rep.Faults["db proxy reset"]+rep.Faults["broker proxy reset"] == 0 {
				t.Error("no reset injected")
			}
			if kind != "postgres" && rep.Faults["broker proxy reset"] == 0 {
				t.Error("no reset on the broker's path")
			}
		})
	}
}

// runChaos runs c and fails the test on any violation and on a run that
// did not exercise its workload.
func runChaos(t *testing.T, c config) *report {
	t.Helper()
	var out strings.Builder
	rep, err := run(context.Background(), c, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Error(v)
	}
	if rep.Valid == 0 || rep.Poison == 0 || rep.ChargedOnce != rep.Valid {
		t.Errorf("%d orders, %d poison, %d charged once", rep.Valid, rep.Poison, rep.ChargedOnce)
	}
	if t.Failed() {
		logTail(t, c.LogDir)
	}
	return rep
}

// logTail puts the end of a failed run's worker logs into the test output:
// the log directory is removed with the test, and CI keeps only the output.
func logTail(t *testing.T, dir string) {
	t.Helper()
	const keep = 120
	logs, _ := filepath.Glob(filepath.Join(dir, "berth-chaos-*.log"))
	for _, name := range logs {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Log(err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		t.Logf("last %d of %d lines of %s:\n%s", min(keep, len(lines)), len(lines), name,
			strings.Join(lines[max(0, len(lines)-keep):], "\n"))
	}
}
