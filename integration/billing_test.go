package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The end-to-end billing test runs the reference scenario of ARCHITECTURE.md on
// every broker, with the real PostgreSQL holding the orders, the charges
// (the side effect) and the idempotency results. On the network brokers a
// worker runs as a child process and is SIGKILLed while some of its jobs sit
// between their commit and their ack; a second worker finishes the run.
// Whatever the broker redelivers, every order must be charged exactly once
// and nothing may be lost.

// Environment of the worker child process.
const (
	envChild  = "BERTH_E2E_CHILD" // "1" in the child
	envBroker = "BERTH_E2E_BROKER"
	envQueue  = "BERTH_E2E_QUEUE"
	envSchema = "BERTH_E2E_SCHEMA"
	envPG     = "BERTH_E2E_PG"
	envAMQP   = "BERTH_E2E_AMQP"
	envSQS    = "BERTH_E2E_SQS"
	envNATS   = "BERTH_E2E_NATS"
)

// httpTransport carries every SQS client of this package, so that TestMain
// can close its idle connections (and their goroutines) before goleak looks.
var httpTransport = &http.Transport{MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second}

// e2eLease is the lease (visibility timeout) of every broker in this test.
const e2eLease = 2 * time.Second

const chargeType = "billing.charge"

type charge struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// shared sets the endpoint of the shared server of broker kind (RabbitMQ,
// the SQS emulator, NATS); the others need none or have their own.
func (ep *endpoints) shared(t *testing.T, kind string) {
	switch kind {
	case "rabbitmq":
		ep.amqp = RabbitMQURL(t)
	case "sqs":
		ep.sqs = SQSEndpoint(t)
	case "jetstream":
		ep.nats = NATSURL(t)
	}
}

// endpoints are the servers of a billing run: its PostgreSQL and its
// broker's.
type endpoints struct {
	pg, amqp, sqs, nats string
	// natsReplicas is the JetStream streams' Replicas (0: the broker's
	// default, one), for a cluster; this process's brokers only.
	natsReplicas int
}

func (e endpoints) env() []string {
	return []string{envPG + "=" + e.pg, envAMQP + "=" + e.amqp, envSQS + "=" + e.sqs, envNATS + "=" + e.nats}
}

func endpointsFromEnv() endpoints {
	return endpoints{pg: os.Getenv(envPG), amqp: os.Getenv(envAMQP), sqs: os.Getenv(envSQS), nats: os.Getenv(envNATS)}
}

// openBroker connects to a broker of kind for the billing queue.
func openBroker(ctx context.Context, kind string, ep endpoints, pool *pgxpool.Pool, schema string) (sdk.Broker, error) {
	switch kind {
	case "memory":
		return memory.New(memory.Options{Lease: e2eLease})
	case "rabbitmq":
		return rabbitmq.New(ctx, ep.amqp, rabbitmq.Options{ConnectionName: "berth-e2e", Prefetch: 16})
	case "sqs":
		cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("berth", "berth", "")}
		return sqs.NewFromConfig(cfg, sqs.Options{VisibilityTimeout: e2eLease, WaitTime: time.Second},
			func(o *awssqs.Options) {
				o.BaseEndpoint = aws.String(ep.sqs)
				o.HTTPClient = &http.Client{Transport: httpTransport}
			})
	case "jetstream":
		return jetstream.Connect(ctx, ep.nats, jetstream.ConnectOptions{Name: "berth-e2e"},
			jetstream.Options{AckWait: e2eLease, WaitTime: time.Second, Replicas: ep.natsReplicas})
	case "postgres":
		b, err := postgres.New(pool, postgres.Options{Schema: schema, Lease: e2eLease, MaxAttempts: 20, PollInterval: 200 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		return b, b.Migrate(ctx)
	}
	return nil, fmt.Errorf("unknown broker %q", kind)
}

// errGateway is the failure billingHandler injects after charging.
var errGateway = errors.New("payment gateway timeout")

// billingHandler is step 5–8 of ARCHITECTURE.md's worker flow, inside the
// transaction the idempotency guard opened: load the order FOR UPDATE,
// validate, charge (insert the charge row: the side effect), mark it paid.
// failRate of the attempts fail after charging, before commit: the
// transaction rolls back and the charge with it.
func billingHandler(schema string, failRate float64) sdk.Handler {
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
		if chargedAt != nil { // charged under another key: record, do not charge again
			idempotency.SetResult(ctx, idempotency.Result{ResourceType: "order", ResourceID: c.OrderID, JSON: []byte(`{"outcome":"already_charged"}`)})
			return nil
		}
		if c.Amount != amount {
			return sdk.Permanent(fmt.Errorf("order %s: amount %d, job says %d", c.OrderID, amount, c.Amount))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+charges+` (order_id, amount) VALUES ($1, $2)`, c.OrderID, c.Amount); err != nil {
			return err
		}
		if rand.Float64() < failRate {
			return errGateway // after the charge: rolled back with it
		}
		if _, err := tx.Exec(ctx, `UPDATE `+orders+` SET status = 'paid', charged_at = now(), version = version + 1, updated_at = now() WHERE id = $1`, c.OrderID); err != nil {
			return err
		}
		idempotency.SetResult(ctx, idempotency.Result{ResourceType: "order", ResourceID: c.OrderID, JSON: []byte(`{"outcome":"charged"}`)})
		return nil
	})
}

// afterCommit runs hook when the guard below it returned nil: the result is
// committed and the Worker is about to ack.
func afterCommit(hook func(sdk.Delivery)) sdk.Middleware {
	return func(next sdk.Handler) sdk.Handler {
		return sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
			err := next.Handle(ctx, d)
			if err == nil && hook != nil {
				hook(d)
			}
			return err
		})
	}
}

func newBillingWorker(b sdk.Broker, queue string, pool *pgxpool.Pool, schema string, stats *idempotency.Stats, hook func(sdk.Delivery)) (*sdk.Worker, error) {
	store, err := pgstore.New(pool, pgstore.Options{Schema: schema})
	if err != nil {
		return nil, err
	}
	guard, err := idempotency.Middleware(idempotency.Options{Store: store, Stats: stats, InProgressDelay: 100 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	return sdk.NewWorker(b, billingHandler(schema, 0.1), sdk.WorkerOptions{
		Queue:       queue,
		Concurrency: 8,
		Lease:       e2eLease,
		Retry:       sdk.RetryPolicy{MaxAttempts: 10, Backoff: sdk.Backoff{Base: 10 * time.Millisecond, Max: 200 * time.Millisecond}},
		Middleware:  []sdk.Middleware{afterCommit(hook), guard},
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
}

// runChild is the worker child process: it processes the queue and prints
// "committed <id>" after each commit, pausing before the ack so that the
// parent's SIGKILL finds jobs committed but not acked.
func runChild() int {
	ctx := context.Background()
	ep := endpointsFromEnv()
	kind, queue, schema := os.Getenv(envBroker), os.Getenv(envQueue), os.Getenv(envSchema)
	pool, err := pgxpool.New(ctx, ep.pg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	b, err := openBroker(ctx, kind, ep, pool, schema)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	var mu sync.Mutex
	hook := func(d sdk.Delivery) {
		mu.Lock()
		fmt.Printf("committed %s\n", d.Message().ID)
		mu.Unlock()
		time.Sleep(50 * time.Millisecond) // the window between commit and ack
	}
	w, err := newBillingWorker(b, queue, pool, schema, &idempotency.Stats{}, hook)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	fmt.Println("ready")
	_ = w.Run(ctx) // until SIGKILL
	return 0
}

type billingRun struct {
	t      *testing.T
	kind   string
	ep     endpoints
	pool   *pgxpool.Pool
	schema string
	queue  string
	broker sdk.Broker
	orders []charge
	ids    map[string]string // message ID -> order, of every published valid job
	// capped accepts a poison job dead-lettered by the broker's delivery
	// cap (class max_deliveries) instead of by the Worker: during a
	// RabbitMQ failover the Worker's dead-letter copy can fail until the
	// cap takes the job (RELIABILITY.md). Either way only poison is there.
	capped bool
	// failRate, when not 0, replaces run.worker's 5 % of failing
	// handler runs; below 0 it means none.
	failRate float64
	// finishWithin bounds finish; default 90s.
	finishWithin time.Duration
	// noDuplicates makes check want no duplicate suppressed: every job
	// was published once, or its copies were dropped by the broker
	// (JetStream's Nats-Msg-Id), so none reached the guard.
	noDuplicates bool
	// trace, when set, records every settlement of the two poison jobs
	// by the workers of run.worker; it is logged when the test fails.
	trace *poisonTrace
	// settled, when set, counts the settlements of run.worker's Workers.
	settled *settleCounts
	// publishRetries counts the inserts and Publish calls publishDuring
	// retried: the fault reached the publishers.
	publishRetries atomic.Int64
	// publishStalled counts the Publish calls of publishDuring that ended
	// with their own 10 s context rather than with an answer or an error
	// of the broker's.
	publishStalled atomic.Int64
	// faultAfter, when not 0, makes underFault wait until that many of its
	// later orders are published (acknowledged by the broker) before the
	// fault: the fault then meets a stream of publishes and fresh acks.
	faultAfter int64
}

// poisonTrace records what the Worker did with each delivery of the poison
// jobs (see publish): where a dead letter went missing, it tells whether
// the Worker's DeadLetter was confirmed, failed, or never happened.
type poisonTrace struct {
	mu    sync.Mutex
	lines []string
}

func (p *poisonTrace) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (p *poisonTrace) Settled(_ context.Context, d sdk.Delivery, s sdk.Settlement) {
	m := d.Message()
	if m.IdempotencyKey != "charge:garbled:v1" && m.IdempotencyKey != "charge:order_missing:v1" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lines = append(p.lines, fmt.Sprintf("%s %s %s attempt %d, received %s: %s (settlement error: %v)",
		time.Now().Format("15:04:05.000"), m.IdempotencyKey, m.ID, d.Attempt(), s.Received.Format("15:04:05.000"), s.Action, s.Err))
}

func (p *poisonTrace) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

func setupBilling(t *testing.T, kind string, ep endpoints) *billingRun {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, ep.pg)
	if err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf("%d", rand.Uint64()%1e12)
	r := &billingRun{t: t, kind: kind, ep: ep, pool: pool, schema: "e2e_" + suffix, queue: "e2e_billing_" + suffix, ids: map[string]string{}}
	s := pgx.Identifier{r.schema}.Sanitize()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+s+` CASCADE`)
		pool.Close()
	})
	ddl := `CREATE SCHEMA ` + s + `;
CREATE TABLE ` + s + `.orders (id text PRIMARY KEY, status text NOT NULL DEFAULT 'pending', version integer NOT NULL DEFAULT 0,
  amount bigint NOT NULL, charged_at timestamptz, updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE ` + s + `.charges (id bigserial PRIMARY KEY, order_id text NOT NULL, amount bigint NOT NULL);`
	if _, err := pool.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(pool, pgstore.Options{Schema: r.schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	r.broker, err = openBroker(ctx, kind, ep, pool, r.schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.broker.Close() })
	if d, ok := r.broker.(sdk.QueueDeclarer); ok {
		if err := d.DeclareQueue(ctx, r.queue); err != nil {
			t.Fatal(err)
		}
	}
	type deleter interface {
		DeleteQueue(ctx context.Context, queue string) error
	}
	if d, ok := r.broker.(deleter); ok {
		t.Cleanup(func() { _ = d.DeleteQueue(context.Background(), r.queue) })
	}
	if b, ok := r.broker.(*sqs.Broker); ok {
		t.Cleanup(func() { _ = b.DeleteQueue(context.Background(), r.queue, true) })
	}
	return r
}

// publish creates n orders and publishes their charge jobs, a quarter of
// them twice (same idempotency key, new message ID), plus two poison jobs:
// an undecodable body and an order that does not exist.
func (r *billingRun) publish(n int) {
	t := r.t
	ctx := context.Background()
	var msgs []*sdk.Message
	for i := range n {
		c := charge{OrderID: fmt.Sprintf("order_%d", i), Amount: int64(100 + i)}
		r.orders = append(r.orders, c)
		if _, err := r.pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{r.schema, "orders"}.Sanitize()+` (id, amount) VALUES ($1, $2)`, c.OrderID, c.Amount); err != nil {
			t.Fatal(err)
		}
		copies := 1
		if i%4 == 0 {
			copies = 2
		}
		for range copies {
			m, err := sdk.NewJSON(chargeType, c)
			if err != nil {
				t.Fatal(err)
			}
			m.IdempotencyKey = "charge:" + c.OrderID + ":v1"
			msgs = append(msgs, m)
		}
	}
	missing, _ := sdk.NewJSON(chargeType, charge{OrderID: "order_missing", Amount: 1})
	missing.IdempotencyKey = "charge:order_missing:v1"
	msgs = append(msgs, &sdk.Message{Type: chargeType, IdempotencyKey: "charge:garbled:v1", Body: []byte("{not json")}, missing)
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	for i := 0; i < len(msgs); i += 10 {
		batch := msgs[i:min(i+10, len(msgs))]
		if err := r.broker.Publish(ctx, r.queue, batch...); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range msgs {
		r.ids[m.ID] = m.IdempotencyKey
	}
}

// killChildAfter starts a worker child and SIGKILLs it once it has committed
// `after` jobs; it returns how many commits the child reported.
func (r *billingRun) killChildAfter(after int) int {
	t := r.t
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=1", envBroker+"="+r.kind, envQueue+"="+r.queue, envSchema+"="+r.schema)
	cmd.Env = append(cmd.Env, r.ep.env()...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	child, lines := StartChildLines(t, cmd) // killed below; not beyond this test
	committed := 0
	timeout := time.After(60 * time.Second)
wait:
	for committed < after {
		select {
		case l, ok := <-lines:
			if !ok {
				break wait
			}
			if strings.HasPrefix(l, "committed ") {
				committed++
			}
		case <-timeout:
			break wait
		}
	}
	_ = child.Cmd.Process.Signal(syscall.SIGKILL)
	err := child.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die by SIGKILL: %v\nstderr:\n%s", err, stderr.String())
	}
	if committed < after {
		t.Fatalf("child committed %d jobs before the timeout, want %d; stderr:\n%s", committed, after, stderr.String())
	}
	return committed
}

// finish runs workers in this process until every order is paid, both
// poison jobs are dead-lettered and the queue is empty.
func (r *billingRun) finish(workers int, stats *idempotency.Stats) {
	t := r.t
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range workers {
		w, err := newBillingWorker(r.broker, r.queue, r.pool, r.schema, stats, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	within := r.finishWithin
	if within == 0 {
		within = 90 * time.Second
	}
	deadline := time.Now().Add(within)
	idle := 0
	// The dead-letter queue's depth each time it changed: a letter missing
	// at the end was either never there or went later.
	var dlqDepth []string
	last := int64(-1)
	for idle < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("not finished in time: paid %d/%d, %s\ndead-letter queue depth when it changed: %s",
				r.paid(), len(r.orders), r.queueState(), strings.Join(dlqDepth, ", "))
		}
		time.Sleep(500 * time.Millisecond)
		st, err := r.broker.(sdk.Inspector).Stats(ctx, r.queue)
		if err != nil {
			t.Fatal(err)
		}
		if st.DeadLettered != last {
			last = st.DeadLettered
			dlqDepth = append(dlqDepth, fmt.Sprintf("%s %d", time.Now().Format("15:04:05.000"), last))
		}
		if r.paid() == len(r.orders) && len(r.deadLetters()) == 2 && st.Ready+st.InFlight+st.Delayed == 0 {
			idle++
		} else {
			idle = 0
		}
	}
}

// deadLetters returns the dead letters by message ID. A worker killed
// between copying a message to the dead-letter queue and deleting the
// original (SQS, RabbitMQ: two steps, not one) leaves the same message there
// twice; that is the transport's at-least-once, and a redrive of both is
// deduplicated by the idempotency key like any other duplicate.
func (r *billingRun) deadLetters() map[string]*sdk.Message {
	dl, err := r.broker.(sdk.DeadLetters).ListDeadLetters(context.Background(), r.queue, 50)
	if err != nil {
		r.t.Fatal(err)
	}
	byID := map[string]*sdk.Message{}
	for _, m := range dl {
		byID[m.ID] = m
	}
	return byID
}

func (r *billingRun) paid() int {
	var n int
	_ = r.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{r.schema, "orders"}.Sanitize()+` WHERE status = 'paid'`).Scan(&n)
	return n
}

func (r *billingRun) queueState() string {
	ctx := context.Background()
	st, err := r.broker.(sdk.Inspector).Stats(ctx, r.queue)
	s := fmt.Sprintf("queue %+v %v; dead letters:", st, err)
	dl, err := r.broker.(sdk.DeadLetters).ListDeadLetters(ctx, r.queue, 10)
	for _, m := range dl {
		s += fmt.Sprintf("\n  %s %s attempts=%s %s: %s", m.ID, m.IdempotencyKey, m.Header(sdk.HeaderDeadLetterAttempts),
			m.Header(sdk.HeaderDeadLetterClass), m.Header(sdk.HeaderDeadLetterReason))
	}
	return s + fmt.Sprint(err)
}

// check asserts the invariants on the data.
func (r *billingRun) check(stats *idempotency.Stats) {
	t := r.t
	ctx := context.Background()
	s := pgx.Identifier{r.schema}.Sanitize()
	rows, err := r.pool.Query(ctx, `SELECT o.id, o.status, o.version, o.amount, count(c.id), coalesce(sum(c.amount), 0)
FROM `+s+`.orders o LEFT JOIN `+s+`.charges c ON c.order_id = o.id GROUP BY o.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var id, status string
		var version int
		var amount, charges, total int64
		if err := rows.Scan(&id, &status, &version, &amount, &charges, &total); err != nil {
			t.Fatal(err)
		}
		seen++
		if charges != 1 || total != amount {
			t.Errorf("order %s charged %d times (total %d, amount %d)", id, charges, total, amount)
		}
		if status != "paid" || version != 1 {
			t.Errorf("order %s: status %s version %d, want paid at version 1 (one update, none lost)", id, status, version)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != len(r.orders) {
		t.Errorf("%d orders, want %d", seen, len(r.orders))
	}
	var results int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.job_results WHERE status = 'completed'`).Scan(&results); err != nil {
		t.Fatal(err)
	}
	if results != len(r.orders) {
		t.Errorf("%d completed idempotency results, want one per order (%d)", results, len(r.orders))
	}
	reasons := map[string]string{}
	for _, m := range r.deadLetters() {
		reasons[m.IdempotencyKey] = m.Header(sdk.HeaderDeadLetterClass) + ": " + m.Header(sdk.HeaderDeadLetterReason)
	}
	ok := func(key string, want bool) bool {
		return want || r.capped && strings.HasPrefix(reasons[key], string(sdk.ClassPoison)+": ")
	}
	if len(reasons) != 2 || !ok("charge:garbled:v1", strings.HasPrefix(reasons["charge:garbled:v1"], "permanent: ")) ||
		!ok("charge:order_missing:v1", strings.Contains(reasons["charge:order_missing:v1"], "does not exist")) {
		t.Errorf("dead letters %v, want the undecodable job and the missing order, both permanent", reasons)
	}
	if snap := stats.Snapshot(); r.noDuplicates && snap.DuplicatesSuppressed != 0 {
		t.Errorf("%d duplicates suppressed (%+v), want none: a copy the broker should have dropped reached a worker", snap.DuplicatesSuppressed, snap)
	} else if !r.noDuplicates && snap.DuplicatesSuppressed == 0 {
		t.Errorf("no duplicate suppressed (%+v): the duplicated jobs were not exercised", snap)
	}
}

func TestBillingExactlyOnceEffect(t *testing.T) {
	ep := endpoints{pg: PostgresDSN(t)}
	for _, kind := range []string{"memory", "rabbitmq", "sqs", "postgres", "jetstream"} {
		t.Run(kind, func(t *testing.T) {
			ep.shared(t, kind)
			r := setupBilling(t, kind, ep)
			const orders = 200
			r.publish(orders)
			stats := &idempotency.Stats{}
			if kind == "memory" {
				// One process: a first worker is stopped midway (graceful
				// shutdown), then two finish.
				r.stopMidway(stats)
			} else {
				got := r.killChildAfter(30)
				t.Logf("%s: child SIGKILLed after %d commits", kind, got)
			}
			r.finish(2, stats)
			r.check(stats)
			t.Logf("%s: %+v", kind, stats.Snapshot())
		})
	}
}

// stopMidway runs one worker until a third of the orders are paid and stops
// it with a cancelled context.
func (r *billingRun) stopMidway(stats *idempotency.Stats) {
	t := r.t
	w, err := newBillingWorker(r.broker, r.queue, r.pool, r.schema, stats, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	for deadline := time.Now().Add(60 * time.Second); r.paid() < len(r.orders)/3; {
		if time.Now().After(deadline) {
			t.Fatalf("first worker paid %d orders in a minute", r.paid())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
