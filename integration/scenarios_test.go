package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/idempotency/redisstore"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Fault scenarios on servers the test owns (RELIABILITY.md): the billing
// workload of billing_test.go runs with workers in this process while a
// server is stopped, restarted or flushed under it; publishers keep
// publishing through the fault and retry what failed with the same
// messages. The invariants are then read from the database and the broker
// by billingRun.check: every order charged once, paid at version 1, one
// idempotency result each, only the two poison jobs dead-lettered.

// underFault publishes a first batch, starts workers, keeps publishing
// `more` orders in batches while fault runs (once a tenth of the first
// batch is paid), then lets the workers finish and checks the invariants.
func (r *billingRun) underFault(stats *idempotency.Stats, cache idempotency.Cache, more int, fault func()) {
	t := r.t
	r.publish(100)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		w, err := r.worker(stats, cache)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := w.Run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	var published atomic.Int64
	pubDone := make(chan error, 1)
	orders := make([]charge, 0, more)
	go func() { pubDone <- r.publishDuring(ctx, more, &orders, &published) }()
	for deadline := time.Now().Add(60 * time.Second); r.paid() < 10 || published.Load() < r.faultAfter; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("workers paid %d orders, %d of %d published in a minute", r.paid(), published.Load(), r.faultAfter)
		}
	}
	before := published.Load()
	fault()
	if err := <-pubDone; err != nil {
		t.Fatalf("publish through the fault: %v", err)
	}
	r.orders = append(r.orders, orders...)
	t.Logf("%d orders published in all, %d during the fault phase (%d of them before the fault began); %d inserts or publishes retried",
		len(r.orders), published.Load(), before, r.publishRetries.Load())
	r.finish(0, stats) // the running workers finish the queue
	cancel()
	wg.Wait()
	r.check(stats)
}

// publishDuring inserts and publishes n orders in batches of five, 20 ms
// apart. A failed insert or Publish is retried (the same messages: a
// transport duplicate at worst) for up to a minute.
func (r *billingRun) publishDuring(ctx context.Context, n int, out *[]charge, published *atomic.Int64) error {
	ordersTable := pgx.Identifier{r.schema, "orders"}.Sanitize()
	retry := func(what string, f func(context.Context) error) error {
		deadline := time.Now().Add(60 * time.Second)
		for {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := f(cctx)
			stalled := err != nil && cctx.Err() != nil
			cancel()
			if err == nil || ctx.Err() != nil {
				return err
			}
			if stalled && what == "publish" {
				r.publishStalled.Add(1)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: %w", what, err)
			}
			r.publishRetries.Add(1)
			time.Sleep(100 * time.Millisecond)
		}
	}
	for i := 0; i < n; i += 5 {
		var msgs []*sdk.Message
		for j := i; j < min(i+5, n); j++ {
			c := charge{OrderID: fmt.Sprintf("order_late_%d", j), Amount: int64(1000 + j)}
			err := retry("insert order", func(ctx context.Context) error {
				_, err := r.pool.Exec(ctx, `INSERT INTO `+ordersTable+` (id, amount) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, c.OrderID, c.Amount)
				return err
			})
			if err != nil {
				return err
			}
			*out = append(*out, c)
			m, err := sdk.NewJSON(chargeType, c)
			if err != nil {
				return err
			}
			m.IdempotencyKey = "charge:" + c.OrderID + ":v1"
			msgs = append(msgs, m)
		}
		if err := retry("publish", func(ctx context.Context) error { return r.broker.Publish(ctx, r.queue, msgs...) }); err != nil {
			return err
		}
		published.Add(int64(len(msgs)))
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// billingMaxAttempts is the attempt cap of run.worker's Workers.
const billingMaxAttempts = 15

// worker is newBillingWorker with an optional dedupe cache in front of the
// store.
func (r *billingRun) worker(stats *idempotency.Stats, cache idempotency.Cache) (*sdk.Worker, error) {
	store, err := pgstore.New(r.pool, pgstore.Options{Schema: r.schema})
	if err != nil {
		return nil, err
	}
	guard, err := idempotency.Middleware(idempotency.Options{Store: store, Stats: stats, Cache: cache, InProgressDelay: 100 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	failRate := 0.05
	if r.failRate != 0 {
		failRate = max(0, r.failRate)
	}
	var observers []sdk.Observer
	if r.trace != nil {
		observers = append(observers, r.trace)
	}
	if r.settled != nil {
		observers = append(observers, r.settled)
	}
	return sdk.NewWorker(r.broker, billingHandler(r.schema, failRate), sdk.WorkerOptions{
		Observers:   observers,
		Queue:       r.queue,
		Concurrency: 8,
		Lease:       e2eLease,
		// Backoff up to 3 s: a store outage (a PostgreSQL restart) fails
		// handlers as transient errors, and 15 attempts must outlast the
		// restart on a loaded machine (about 30 s of retries; 1 s apart, 15 s).
		Retry:      sdk.RetryPolicy{MaxAttempts: billingMaxAttempts, Backoff: sdk.Backoff{Base: 20 * time.Millisecond, Max: 3 * time.Second}},
		Middleware: []sdk.Middleware{guard},
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
}

// The RabbitMQ node stops cleanly mid-run and comes back with its data:
// publishers wait for the connection and retry, consumers reconnect, and
// every confirmed message is processed once in effect.
func TestScenarioRabbitMQNodeRestart(t *testing.T) {
	node := StartRabbitMQ(t)
	r := setupBilling(t, "rabbitmq", endpoints{pg: PostgresDSN(t), amqp: node.URL})
	stats := &idempotency.Stats{}
	r.underFault(stats, nil, 100, func() {
		start := time.Now()
		node.Stop(t)
		time.Sleep(time.Second) // publishers and consumers see it down
		node.Start(t)
		t.Logf("node down for %v", time.Since(start).Round(100*time.Millisecond))
	})
	t.Logf("%+v", stats.Snapshot())
}

// A private nats-server (JetStream, file store) stops mid-run and starts
// again on the same store directory: publishers are refused while it is
// down and retry the same messages (the Nats-Msg-Id dedupes a retried
// Publish that was stored), consumers reconnect, and every message JetStream
// acknowledged is processed once in effect.
func TestScenarioNATSRestart(t *testing.T) {
	for _, mode := range []string{"stop", "kill"} {
		t.Run(mode, func(t *testing.T) {
			srv := StartNATS(t)
			r := setupBilling(t, "jetstream", endpoints{pg: PostgresDSN(t), nats: srv.URL})
			r.faultAfter = 40 // mid-stream: some publishes just acknowledged, the rest retried
			stats := &idempotency.Stats{}
			r.underFault(stats, nil, 100, func() {
				start := time.Now()
				if mode == "kill" {
					srv.Kill(t)
				} else {
					srv.Stop(t)
				}
				time.Sleep(time.Second) // publishers and consumers see it down
				srv.Start(t)
				t.Logf("nats-server %s: down for %v", mode, time.Since(start).Round(10*time.Millisecond))
			})
			t.Logf("%+v", stats.Snapshot())
			if t.Failed() {
				t.Logf("nats-server log:\n%s", srv.Log())
			}
		})
	}
}

// PostgreSQL — the broker's job table, the idempotency store and the
// business tables alike — restarts mid-run, with a fast and with an
// immediate (crash-recovery) shutdown.
func TestScenarioPostgresRestart(t *testing.T) {
	for _, mode := range []string{PostgresFast, PostgresImmediate} {
		t.Run(mode, func(t *testing.T) {
			pg := StartPostgres(t)
			r := setupBilling(t, "postgres", endpoints{pg: pg.DSN})
			stats := &idempotency.Stats{}
			r.underFault(stats, nil, 100, func() {
				start := time.Now()
				pg.Stop(t, mode)
				time.Sleep(500 * time.Millisecond)
				pg.Start(t)
				t.Logf("%s restart: down for %v", mode, time.Since(start).Round(10*time.Millisecond))
			})
		})
	}
}

// The idempotency store's PostgreSQL (a private cluster that also holds the
// orders and charges) restarts with an immediate shutdown while Workers on
// each message broker process the billing workload: the guard's
// transactions fail, their jobs are retried through the broker, and
// nothing is charged twice, lost, or dead-lettered but the two poison jobs.
// The subtests are named after the broker (-run
// 'TestScenarioStoreRestart/rabbitmq').
func TestScenarioStoreRestart(t *testing.T) {
	for _, kind := range []string{"rabbitmq", "sqs", "jetstream"} {
		t.Run(kind, func(t *testing.T) {
			ep := endpoints{}
			ep.shared(t, kind)
			pg := StartPostgres(t)
			ep.pg = pg.DSN
			r := setupBilling(t, kind, ep)
			r.settled = &settleCounts{}
			stats := &idempotency.Stats{}
			var down time.Duration
			var before int64
			r.underFault(stats, nil, 100, func() {
				before = r.settled.storeRetries.Load()
				start := time.Now()
				pg.Stop(t, PostgresImmediate)
				time.Sleep(500 * time.Millisecond)
				pg.Start(t)
				down = time.Since(start)
			})
			c := r.settled
			t.Logf("%s: store down for %v; %d handler runs failed by the store and retried (%d before the fault), %d by the injected gateway failure; highest attempt %d of %d; %d dead-lettered by the Worker; %+v",
				kind, down.Round(10*time.Millisecond), c.storeRetries.Load(), before, c.gatewayRetries.Load(),
				c.maxAttempt.Load(), billingMaxAttempts, c.deadLettered.Load(), stats.Snapshot())
			if c.storeRetries.Load() == before {
				t.Error("no handler run failed by the store was retried: the restart did not reach the workers")
			}
		})
	}
}

// settleCounts counts the settlements of run.worker's Workers: the runs
// retried because of the injected gateway failure and the others (here,
// the store's), the highest attempt seen, the runs dead-lettered.
type settleCounts struct {
	storeRetries, gatewayRetries, deadLettered, maxAttempt atomic.Int64
}

func (c *settleCounts) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (c *settleCounts) Settled(_ context.Context, d sdk.Delivery, s sdk.Settlement) {
	switch s.Action {
	case sdk.ActionRetry:
		if errors.Is(s.Cause, errGateway) {
			c.gatewayRetries.Add(1)
		} else {
			c.storeRetries.Add(1)
		}
	case sdk.ActionDeadLetter:
		c.deadLettered.Add(1)
	}
	for a := int64(d.Attempt()); ; {
		m := c.maxAttempt.Load()
		if a <= m || c.maxAttempt.CompareAndSwap(m, a) {
			break
		}
	}
}

// The Redis dedupe cache is flushed (FLUSHALL) mid-run and again before
// every job is published a second time: duplicates the cache no longer
// knows are stopped by the durable store, so nothing is charged twice.
func TestScenarioRedisFlushAll(t *testing.T) {
	rs := StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	cache, err := redisstore.New(rdb, redisstore.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := setupBilling(t, "postgres", endpoints{pg: PostgresDSN(t)})
	stats := &idempotency.Stats{}
	r.underFault(stats, cache, 100, func() {
		if err := rdb.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	})
	hits := stats.Snapshot().CacheHits
	// Every order again, as a producer replaying its log would: first with
	// the cache warm (its fast path answers), then after a flush (the store does).
	for round, flush := range []bool{false, true} {
		if flush {
			if err := rdb.FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		var msgs []*sdk.Message
		for _, c := range r.orders {
			m, err := sdk.NewJSON(chargeType, c)
			if err != nil {
				t.Fatal(err)
			}
			m.IdempotencyKey = "charge:" + c.OrderID + ":v1"
			msgs = append(msgs, m)
		}
		for i := 0; i < len(msgs); i += 50 {
			if err := r.broker.Publish(context.Background(), r.queue, msgs[i:min(i+50, len(msgs))]...); err != nil {
				t.Fatal(err)
			}
		}
		before := stats.Snapshot()
		w, err := r.worker(stats, cache)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		r.finish(0, stats)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		after := stats.Snapshot()
		t.Logf("replay %d (flushed %v): %d cache hits, %d duplicates suppressed", round, flush,
			after.CacheHits-before.CacheHits, after.DuplicatesSuppressed-before.DuplicatesSuppressed)
		if got := after.DuplicatesSuppressed - before.DuplicatesSuppressed; got < int64(len(msgs)) {
			t.Errorf("replay %d: %d duplicates suppressed, want %d", round, got, len(msgs))
		}
		if !flush && after.CacheHits-before.CacheHits == 0 {
			t.Errorf("replay with a warm cache: no cache hit, the fast path was not exercised")
		}
	}
	if hits == 0 && stats.Snapshot().CacheHits == 0 {
		t.Error("the cache was never hit")
	}
	r.check(stats)
}

// The transactional outbox's PostgreSQL restarts (immediate) while a
// producer writes orders with their charge jobs in one transaction and the
// relay publishes them: every committed job reaches the broker (a commit
// whose answer was lost is retried and may be published twice) and is
// charged once; the outbox ends empty with nothing parked.
func TestScenarioPostgresRestartOutbox(t *testing.T) {
	pg := StartPostgres(t)
	r := setupBilling(t, "memory", endpoints{pg: pg.DSN})
	ob, err := outbox.New(r.pool, outbox.Options{Schema: r.schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	r.publish(0) // the two poison jobs
	stats := &idempotency.Stats{}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = ob.Relay(runCtx, r.broker, outbox.RelayOptions{PollInterval: 50 * time.Millisecond,
			Backoff: sdk.Backoff{Base: 50 * time.Millisecond, Max: time.Second},
			Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	})
	for range 2 {
		w, err := r.worker(stats, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := w.Run(runCtx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	ordersTable := pgx.Identifier{r.schema, "orders"}.Sanitize()
	produce := func(i int) error {
		c := charge{OrderID: fmt.Sprintf("order_ob_%d", i), Amount: int64(700 + i)}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		tx, err := r.pool.Begin(cctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(cctx)
		if _, err := tx.Exec(cctx, `INSERT INTO `+ordersTable+` (id, amount) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, c.OrderID, c.Amount); err != nil {
			return err
		}
		m, err := sdk.NewJSON(chargeType, c)
		if err != nil {
			return err
		}
		m.IdempotencyKey = "charge:" + c.OrderID + ":v1"
		msgs := []*sdk.Message{m}
		if i%4 == 0 { // a producer that writes a job twice
			m2 := *m
			m2.ID = ""
			msgs = append(msgs, &m2)
		}
		if err := ob.Add(cctx, tx, r.queue, msgs...); err != nil {
			return err
		}
		if err := tx.Commit(cctx); err != nil {
			return err
		}
		r.orders = append(r.orders, c)
		return nil
	}
	var produced, retried atomic.Int64
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		for i := range 200 {
			for produce(i) != nil { // the producer retries its transaction
				retried.Add(1)
				time.Sleep(50 * time.Millisecond)
			}
			produced.Add(1)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	for produced.Load() < 60 {
		time.Sleep(5 * time.Millisecond)
	}
	pg.Stop(t, PostgresImmediate)
	time.Sleep(300 * time.Millisecond)
	pg.Start(t)
	<-prodDone
	failed := retried.Load()
	t.Logf("200 orders written with their jobs; %d transactions retried across the restart", failed)
	r.finish(0, stats)
	stop()
	wg.Wait()
	if n, err := ob.Pending(ctx); err != nil || n != 0 {
		t.Errorf("outbox pending %d, %v; want 0", n, err)
	}
	if parked, err := ob.Parked(ctx, 10); err != nil || len(parked) != 0 {
		t.Errorf("outbox parked %v, %v; want none", parked, err)
	}
	r.check(stats)
}
