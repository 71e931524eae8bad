package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Environment of a worker child process.
const (
	envChild  = "BERTH_CHAOS_CHILD" // "1" in a child
	envBroker = "BERTH_CHAOS_BROKER"
	envQueue  = "BERTH_CHAOS_QUEUE"
	envSchema = "BERTH_CHAOS_SCHEMA"
	envPG     = "BERTH_CHAOS_PG"    // through the database proxy
	envURL    = "BERTH_CHAOS_URL"   // the broker, through its proxy
	envFail   = "BERTH_CHAOS_FAIL"  // probability of a transient failure after the charge
	envOut    = "BERTH_CHAOS_LEASE" // lease
	envWork   = "BERTH_CHAOS_WORK"  // the longest payment call
	envTrace  = "BERTH_CHAOS_TRACE" // "1": log every delivery's start and settlement
	chargeTyp = "billing.charge"
	leaseDflt = 3 * time.Second
	// slowLeaseDflt is the lease under -faults slow. Through the slow proxy
	// (100 ms each way) a lease extension that needs a fresh connection
	// after a reset costs about six round trips (TCP, SSLRequest, startup,
	// parse, bind and execute): 1.2 s. A 3 s lease extended every second
	// lost one now and then (once in CI, once more on 2026-12-01) when a
	// reset cut the first extension on its new connection and the retry
	// needed as long again: both must fit between the last extension and
	// the lease's end (lease - interval). 6 s was not enough either
	// (2026-12-02): a job waiting its turn behind busy handlers had its
	// first extension stall about 2.5 s on a connection the proxy then
	// reset (the resets come every 2-4 s), and the two attempts after it
	// met a reset and a fresh connection. 10 s, extended every 3.3 s,
	// leaves 6.7 s: one stall up to the reset interval (4 s) and two
	// reconnections (2.4 s).
	slowLeaseDflt = 10 * time.Second
	// natsWait is a JetStream Receive's long poll: one that divides the
	// AckWait lines empty polls up with redeliveries, which nats-server
	// 2.9.10 can lose (brokers/jetstream's package doc).
	natsWait = 1300 * time.Millisecond
	// brokerKinds is what -broker accepts, for the error messages.
	brokerKinds = "rabbitmq, postgres, sqs or jetstream"
)

type charge struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// openBroker connects to kind at url. pool serves the postgres broker.
func openBroker(ctx context.Context, kind, url string, pool *pgxpool.Pool, schema string, lease time.Duration, client *http.Client) (sdk.Broker, error) {
	switch kind {
	case "rabbitmq":
		return rabbitmq.New(ctx, url, rabbitmq.Options{ConnectionName: "berth-chaos", Heartbeat: 2 * time.Second,
			UnavailableAfter: 20 * time.Second, MaxDeliveries: 20, Logger: quietLogger()})
	case "sqs":
		cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("berth", "berth", "")}
		return sqs.NewFromConfig(cfg, sqs.Options{VisibilityTimeout: lease, WaitTime: time.Second, MaxReceiveCount: 20},
			func(o *awssqs.Options) {
				o.BaseEndpoint = aws.String(url)
				o.HTTPClient = client
			})
	case "jetstream":
		// The queue's name is unique per run, and so are its streams
		// (BERTH_Q_<queue>, BERTH_DLQ_<queue>, BERTH_LOCK_<queue>), which
		// the parent deletes at the end: parallel runs on one NATS server
		// do not meet. WaitTime divides none of the leases (3 s, 10 s,
		// 15 s): see the package doc on nats-server 2.9.10.
		return jetstream.Connect(ctx, url, jetstream.ConnectOptions{Name: "berth-chaos", ReconnectWait: 250 * time.Millisecond},
			jetstream.Options{AckWait: lease, WaitTime: natsWait, MaxDeliveries: 20, Logger: quietLogger()})
	case "postgres":
		b, err := postgres.New(pool, postgres.Options{Schema: schema, Lease: lease, MaxAttempts: 20, PollInterval: 200 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		return b, b.Migrate(ctx)
	}
	return nil, fmt.Errorf("unknown broker %q (want %s)", kind, brokerKinds)
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// billing is the handler: inside the guard's transaction, load the order
// FOR UPDATE, validate, insert the charge (the side effect), mark the order
// paid. failRate of the runs fail after the charge, before the commit, and
// take the charge with them.
func billing(schema string, failRate float64, work time.Duration) sdk.Handler {
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	charges := pgx.Identifier{schema, "charges"}.Sanitize()
	return sdk.JSON(func(ctx context.Context, d sdk.Delivery, c charge) error {
		tx, ok := pgstore.TxFrom(ctx)
		if !ok {
			return sdk.Permanent(errors.New("billing: no transaction in context"))
		}
		var chargedAt *time.Time
		var amount int64
		err := tx.QueryRow(ctx, `SELECT charged_at, amount FROM `+orders+` WHERE id = $1 FOR UPDATE`, c.OrderID).Scan(&chargedAt, &amount)
		if errors.Is(err, pgx.ErrNoRows) {
			return sdk.Permanent(fmt.Errorf("order %s does not exist", c.OrderID))
		}
		if err != nil {
			return err
		}
		if chargedAt != nil {
			idempotency.SetResult(ctx, idempotency.Result{ResourceType: "order", ResourceID: c.OrderID, JSON: []byte(`{"outcome":"already_charged"}`)})
			return nil
		}
		if c.Amount != amount {
			return sdk.Permanent(fmt.Errorf("order %s: amount %d, job says %d", c.OrderID, amount, c.Amount))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+charges+` (order_id, amount, attempt) VALUES ($1, $2, $3)`, c.OrderID, c.Amount, d.Attempt()); err != nil {
			return err
		}
		time.Sleep(rand.N(work) + 1) // the payment call
		if rand.Float64() < failRate {
			return errors.New("payment gateway timeout")
		}
		if _, err := tx.Exec(ctx, `UPDATE `+orders+` SET status = 'paid', charged_at = now(), version = version + 1 WHERE id = $1`, c.OrderID); err != nil {
			return err
		}
		idempotency.SetResult(ctx, idempotency.Result{ResourceType: "order", ResourceID: c.OrderID, JSON: []byte(`{"outcome":"charged"}`)})
		return nil
	})
}

// runChild is a worker process: it consumes until SIGTERM, drains and exits 0.
func runChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "chaos worker:", err)
		return 1
	}
	lease := leaseDflt
	if d, err := time.ParseDuration(os.Getenv(envOut)); err == nil && d > 0 {
		lease = d
	}
	work, err := time.ParseDuration(os.Getenv(envWork))
	if err != nil || work <= 0 {
		work = 20 * time.Millisecond
	}
	var failRate float64
	_, _ = fmt.Sscan(os.Getenv(envFail), &failRate)
	schema := os.Getenv(envSchema)
	// The database may be unreachable right now (a frozen proxy): connect
	// lazily and let the Worker's retries ride it out.
	cfg, err := pgxpool.ParseConfig(os.Getenv(envPG))
	if err != nil {
		return fail(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	client := &http.Client{Timeout: 10 * time.Second}
	var b sdk.Broker
	for {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		b, err = openBroker(octx, os.Getenv(envBroker), os.Getenv(envURL), pool, schema, lease, client)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return 0 // stopped before it started: nothing held
		}
		fmt.Fprintln(os.Stderr, "chaos worker: connect:", err)
		time.Sleep(500 * time.Millisecond)
	}
	defer b.Close()
	store, err := pgstore.New(pool, pgstore.Options{Schema: schema})
	if err != nil {
		return fail(err)
	}
	guard, err := idempotency.Middleware(idempotency.Options{Store: store, InProgressDelay: 100 * time.Millisecond})
	if err != nil {
		return fail(err)
	}
	obs := &counter{trace: os.Getenv(envTrace) == "1"}
	w, err := sdk.NewWorker(b, billing(schema, failRate, work), sdk.WorkerOptions{
		Queue:        os.Getenv(envQueue),
		Concurrency:  4,
		Lease:        lease,
		DrainTimeout: 5 * time.Second,
		Retry:        sdk.RetryPolicy{MaxAttempts: 15, Backoff: sdk.Backoff{Base: 20 * time.Millisecond, Max: 500 * time.Millisecond}},
		Middleware:   []sdk.Middleware{guard},
		Observers:    []sdk.Observer{obs},
		Logger:       quietLogger(),
	})
	if err != nil {
		return fail(err)
	}
	fmt.Println("ready")
	err = w.Run(ctx)
	// The parent adds these up over the workers that exit cleanly.
	fmt.Printf("stats lease_lost=%d released=%d\n", obs.leaseLost.Load(), obs.released.Load())
	if err != nil && !errors.Is(err, context.Canceled) {
		return fail(err)
	}
	return 0
}

// counter counts the settlements the invariants do not show: leases lost
// (the handler's context cancelled, the delivery left to another worker)
// and deliveries released (handed back without consuming an attempt).
type counter struct {
	leaseLost, released atomic.Int64
	trace               bool // -trace: every start and settlement to the log
}

func (c *counter) Start(ctx context.Context, d sdk.Delivery) context.Context {
	if c.trace {
		fmt.Fprintf(os.Stderr, "%s start: pid %d id %q key %q attempt %d\n",
			time.Now().Format("15:04:05.000"), os.Getpid(), d.Message().ID, d.Message().IdempotencyKey, d.Attempt())
	}
	return ctx
}

// LeaseExtended writes every failed extension to the worker's log: a
// lease lost with heartbeats on is a violation of the slow mix, and this
// line says why it was lost.
func (c *counter) LeaseExtended(_ context.Context, d sdk.Delivery, _ time.Duration, err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s lease extension failed: pid %d id %q attempt %d: %v\n",
			time.Now().Format("15:04:05.000"), os.Getpid(), d.Message().ID, d.Attempt(), err)
	}
}

func (c *counter) Settled(_ context.Context, d sdk.Delivery, s sdk.Settlement) {
	if c.trace {
		fmt.Fprintf(os.Stderr, "%s settled: pid %d id %q attempt %d action %v err %v\n",
			time.Now().Format("15:04:05.000"), os.Getpid(), d.Message().ID, d.Attempt(), s.Action, s.Err)
	}
	switch s.Action {
	case sdk.ActionLeaseLost:
		c.leaseLost.Add(1)
		fmt.Fprintf(os.Stderr, "%s lease lost: pid %d id %q attempt %d received %s ran %v cause %v\n",
			time.Now().Format("15:04:05.000"), os.Getpid(), d.Message().ID, d.Attempt(),
			s.Received.Format("15:04:05.000"), s.Duration, s.Cause)
	case sdk.ActionRelease:
		c.released.Add(1)
	}
}
