package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// A RabbitMQ service with a ledger in PostgreSQL: publishes go through the
// ledger's Publisher, the Worker has the ledger among its observers, and
// anyone can then ask what happened to a job. On the PostgreSQL broker,
// read its jobs table with pgledger.NewJobs instead and feed nothing.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgledger.New(pool, pgledger.Options{}) // berth.ledger_jobs
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	l, err := ledger.New(ledger.Options{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close() // writes what is buffered

	b, err := rabbitmq.New(ctx, "amqp://guest:guest@127.0.0.1:5672/", rabbitmq.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	charge := &sdk.Message{Type: "billing.charge", IdempotencyKey: "charge:order_123:v1", Body: []byte(`{"order":"123"}`)}
	if err := l.Publisher(b).Publish(ctx, "billing", charge); err != nil {
		log.Fatal(err)
	}
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "billing", Observers: []sdk.Observer{l}}) // beside telemetry's Observer, if any
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = w.Run(ctx) }()

	// What happened to order 123's charge?
	j, err := store.JobByKey(ctx, "charge:order_123:v1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(j.Status, j.Attempts, j.LastError)
	for _, a := range j.History {
		fmt.Println(a.Attempt, a.Status, a.Error, a.Abandoned)
	}
	// Which jobs of the queue are retrying, and why? How many failed in
	// the last hour, by error class?
	page, err := store.List(ctx, ledger.Filter{Queue: "billing", Statuses: []ledger.Status{ledger.StatusRetrying}})
	if err != nil {
		log.Fatal(err)
	}
	for _, j := range page.Jobs {
		fmt.Println(j.MessageID, j.Attempts, j.NextAttemptAt, j.ErrorClass, j.LastError)
	}
	counts, err := store.Counts(ctx, ledger.Window{Queue: "billing", Since: time.Now().Add(-time.Hour)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(counts.ByStatus[ledger.StatusDead], counts.ByClass)
	// Keep a week of finished jobs.
	if _, err := store.Purge(ctx, time.Now().Add(-7*24*time.Hour), 0); err != nil {
		log.Fatal(err)
	}
}

// printStore is a Store that prints what the ledger writes: the events a
// job goes through.
type printStore struct{}

func (printStore) Write(_ context.Context, batch []ledger.Event) error {
	for _, e := range batch {
		line := fmt.Sprintf("%s attempt %d", e.Status, e.Attempt)
		if e.Error != "" {
			line += fmt.Sprintf(" (%s: %s)", e.Class, e.Error)
		}
		fmt.Println(line)
	}
	return nil
}

// The events the feeds record for a job that fails once, then succeeds:
// what a Store receives, in order.
func ExampleLedger_Start() {
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	l, err := ledger.New(ledger.Options{Store: printStore{}, Linger: -1, BatchSize: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	if err := l.Publisher(b).Publish(ctx, "emails", &sdk.Message{Type: "email.send"}); err != nil {
		log.Fatal(err)
	}
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Attempt() == 1 {
			return errors.New("smtp: timeout")
		}
		return nil
	}), sdk.WorkerOptions{Queue: "emails", Concurrency: 1, Observers: []sdk.Observer{l},
		Retry: sdk.RetryPolicy{Backoff: sdk.Backoff{Base: time.Millisecond, Max: time.Millisecond}}})
	if err != nil {
		log.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	for l.Stats().Recorded < 5 { // enqueued, two starts, two settlements
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	_ = l.Flush(ctx)
	// Output:
	// enqueued attempt 0
	// running attempt 1
	// retrying attempt 1 (transient: smtp: timeout)
	// running attempt 2
	// succeeded attempt 2
}

// ExampleRunJanitor keeps a ledger bounded (finished jobs kept 3 days,
// jobs that never finished 12 days after their last event, the default 4 ×
// Retention; purged 1000 rows per statement) and its broker-side dead letters
// recorded, on a goroutine the program owns and stops.
func ExampleRunJanitor() {
	ctx, stop := context.WithCancel(context.Background())
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgledger.New(pool, pgledger.Options{})
	if err != nil {
		log.Fatal(err)
	}
	l, err := ledger.New(ledger.Options{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	b, err := rabbitmq.New(ctx, "amqp://guest:guest@127.0.0.1:5672/", rabbitmq.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	done := make(chan error, 1)
	go func() {
		done <- ledger.RunJanitor(ctx, ledger.JanitorOptions{
			Purger: store, Retention: 72 * time.Hour, Batch: 1000, Interval: 5 * time.Minute,
			Ledger: l, DeadLetters: b, DeadLetterQueues: []string{"billing"},
			Report: func(r ledger.JanitorRun) {
				if r.Err != nil {
					log.Printf("ledger janitor: %v", r.Err)
				}
			},
		})
	}()
	// ... run the workers ...
	stop()
	<-done // context.Canceled
}
