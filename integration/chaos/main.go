// Command chaos runs berth's billing workload on a real broker while it
// breaks things, then checks from the database and the broker that every
// valid order was charged exactly once.
//
//	go run ./integration/chaos -broker rabbitmq -duration 2m
//	go run ./integration/chaos -broker postgres -duration 2m
//	go run ./integration/chaos -broker sqs -duration 2m
//	go run ./integration/chaos -broker jetstream -duration 2m
//
// Worker child processes (this program, re-executed) consume the queue with
// the PostgreSQL idempotency guard: each charge job loads its order FOR
// UPDATE, inserts a charge row (the side effect) and marks the order paid in
// the transaction that stores the job's result. The parent publishes orders
// at -rate per second, every fourth twice (same idempotency key), plus
// poison jobs (an undecodable body, an order that does not exist). For
// -duration it injects, at random every 0.3–1.5 s: SIGKILL of a worker,
// SIGTERM of a worker (its drain is timed), termination of the workers'
// PostgreSQL backends, a reset of every connection through the fault proxy
// in front of the broker or the database, or a freeze (half-open) of one of
// those proxies for up to two seconds. Then it stops the faults, lets the
// workers finish, stops them with SIGTERM and prints the invariant table:
// published, charged once, charged twice or more, never charged, dead
// letters (valid vs poison), leftovers and drain times. It exits 1 when an
// invariant is violated.
//
// The services come from the flags, else the same environment variables
// and loopback defaults as berth's tests (BERTH_POSTGRES_DSN,
// BERTH_RABBITMQ_URL, BERTH_SQS_ENDPOINT, BERTH_NATS_URL). The run lives in
// its own PostgreSQL schema and queue (on JetStream, the queue's streams),
// removed at the end unless -keep.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if os.Getenv(envChild) == "1" {
		os.Exit(runChild())
	}
	c := config{}
	flag.StringVar(&c.Broker, "broker", "rabbitmq", "broker: "+brokerKinds)
	flag.DurationVar(&c.Duration, "duration", 2*time.Minute, "how long faults are injected")
	flag.IntVar(&c.Workers, "workers", 3, "worker processes")
	flag.IntVar(&c.Rate, "rate", 20, "orders published per second")
	flag.StringVar(&c.PostgresDSN, "postgres", envOr("BERTH_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL DSN (orders, charges, idempotency results; the postgres broker's jobs)")
	flag.StringVar(&c.RabbitMQURL, "rabbitmq", envOr("BERTH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.StringVar(&c.SQSEndpoint, "sqs", envOr("BERTH_SQS_ENDPOINT", "http://127.0.0.1:4566"), "SQS endpoint")
	flag.StringVar(&c.NATSURL, "nats", envOr("BERTH_NATS_URL", "nats://127.0.0.1:4222"), "NATS (JetStream) URL")
	flag.Uint64Var(&c.Seed, "seed", 0, "random seed (0: from the clock)")
	flag.DurationVar(&c.Settle, "settle", 2*time.Minute, "how long the workers may take to finish after the faults stop")
	flag.BoolVar(&c.Keep, "keep", false, "keep the schema and the queue")
	flag.BoolVar(&c.Trace, "trace", false, "log every delivery's start and settlement to the worker log")
	flag.StringVar(&c.Faults, "faults", "mixed", "fault mix: mixed, rolling (SIGTERM every worker in turn) or slow (200 ms per round trip and resets)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, c, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if len(rep.Violations) > 0 {
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
