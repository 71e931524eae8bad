// Command billing is berth's reference scenario: charge every order exactly
// once on an at-least-once broker, while jobs are published twice, payment
// calls fail transiently, one job is poison and (with -crash) workers die
// between their commit and their ack.
//
// Each charge job follows the safe worker flow of ARCHITECTURE.md ("Reference
// schema and the billing scenario"): the broker and
// the Worker take and lease the job (1, 2); an optional in-process lock
// serialises work per order (3, -lock); the idempotency guard checks the key
// charge:<order>:v1 against job_results and, when it is new, opens the
// transaction that holds it (4); the handler loads the order FOR UPDATE (5),
// validates it (6: missing → permanent; already charged → result
// "already_charged", ack), charges it and updates the order — status paid,
// charged_at, version+1 — and the guard stores the result, all in one
// transaction (7, 8); the Worker acks after the commit (9) and classifies
// failures (10: transient → backoff retry, permanent → dead-letter queue).
//
// By default everything is in memory, so it runs anywhere:
//
//	go run ./examples/billing
//	go run ./examples/billing -crash -lock
//	go run ./examples/billing -postgres postgres://postgres@127.0.0.1:5432/test
//	go run ./examples/billing -broker postgres -postgres postgres://postgres@127.0.0.1:5432/test
//	go run ./examples/billing -broker rabbitmq -rabbitmq amqp://guest:guest@127.0.0.1:5672/
//	go run ./examples/billing -broker sqs -sqs http://127.0.0.1:4566
//	go run ./examples/billing -broker jetstream -nats nats://127.0.0.1:4222
//	go run ./examples/billing -redis 127.0.0.1:6379 -crash
//
// With -redis, a Redis cache (SET NX EX, written after each commit) answers
// most duplicates before the store is asked; it is never the source of
// truth. With -postgres the orders, charges and job_results tables live in a fresh
// schema of that database, dropped at the end (Ctrl-C or SIGTERM included)
// unless -keep. The summary ends with the number of orders charged twice; the
// exit status is 1 unless it is 0 and every valid order was charged.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var c config
	flag.StringVar(&c.Broker, "broker", "memory", "broker: memory, rabbitmq, sqs, postgres or jetstream")
	flag.StringVar(&c.PostgresDSN, "postgres", os.Getenv("BERTH_POSTGRES_DSN"), "PostgreSQL DSN for the stores (and -broker postgres); default $BERTH_POSTGRES_DSN, empty means memory stores")
	flag.StringVar(&c.RabbitMQURL, "rabbitmq", os.Getenv("BERTH_RABBITMQ_URL"), "RabbitMQ URL for -broker rabbitmq; default $BERTH_RABBITMQ_URL")
	flag.StringVar(&c.RedisAddr, "redis", "", "Redis host:port for the dedupe cache in front of the store (optional)")
	flag.StringVar(&c.SQSEndpoint, "sqs", os.Getenv("BERTH_SQS_ENDPOINT"), "SQS endpoint for -broker sqs; default $BERTH_SQS_ENDPOINT")
	flag.StringVar(&c.NATSURL, "nats", natsDefault(), "NATS URL for -broker jetstream; default $BERTH_NATS_URL, else nats://127.0.0.1:4222")
	flag.IntVar(&c.Orders, "orders", 60, "number of orders")
	flag.IntVar(&c.DupEvery, "dup-every", 3, "publish every n-th order's job twice")
	flag.IntVar(&c.Workers, "workers", 3, "Worker instances")
	flag.IntVar(&c.Concurrency, "concurrency", 4, "handlers per Worker")
	flag.Float64Var(&c.FailRate, "fail-rate", 0.2, "probability of an injected transient failure on the first two attempts")
	flag.BoolVar(&c.Crash, "crash", false, "lose a tenth of first-attempt acks, as workers killed after commit and before ack")
	flag.BoolVar(&c.Lock, "lock", false, "lock each order in this process while its job runs (step 3)")
	flag.Uint64Var(&c.Seed, "seed", 0, "random seed (0: random)")
	flag.DurationVar(&c.Timeout, "timeout", 25*time.Second, "give up after this long")
	flag.BoolVar(&c.Keep, "keep", false, "keep the PostgreSQL schema and the queue")
	verbose := flag.Bool("v", false, "log the workers' debug output")
	flag.Parse()
	if *verbose {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	// Ctrl-C or SIGTERM stops the scenario, its schema and queue removed
	// (unless -keep); a second one kills it at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	s, err := run(ctx, c, os.Stdout)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) { // stopped while setting up: say why
			err = fmt.Errorf("%w (%v)", err, context.Cause(ctx))
		}
		fmt.Fprintln(os.Stderr, "billing:", err)
		os.Exit(1)
	}
	if s.ChargedTwice != 0 || len(s.NotCharged) != 0 {
		os.Exit(1)
	}
}

func natsDefault() string {
	if u := os.Getenv("BERTH_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}
