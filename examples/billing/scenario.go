package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/idempotency/redisstore"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// config is the scenario's knobs; main fills it from flags.
type config struct {
	Broker      string // memory | rabbitmq | sqs | postgres | jetstream
	PostgresDSN string // stores (job_results, orders) in PostgreSQL; required by -broker postgres
	RabbitMQURL string
	SQSEndpoint string
	NATSURL     string
	RedisAddr   string // optional: the Redis dedupe cache in front of the store

	Orders      int
	DupEvery    int     // every DupEvery-th order is published twice
	Workers     int     // Worker instances
	Concurrency int     // handlers per Worker
	FailRate    float64 // injected transient failures (first two attempts only)
	Crash       bool    // drop some acks, as a worker killed after commit and before ack would
	Lock        bool    // step 3: lock the order in this process
	Seed        uint64
	Timeout     time.Duration
	Keep        bool // keep the PostgreSQL schema and the queue
	Logger      *slog.Logger
}

func (c *config) defaults() error {
	if c.Broker == "" {
		c.Broker = "memory"
	}
	if c.Orders <= 0 {
		c.Orders = 60
	}
	if c.DupEvery <= 0 {
		c.DupEvery = 3
	}
	if c.Workers <= 0 {
		c.Workers = 3
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 4
	}
	if c.Timeout <= 0 {
		c.Timeout = 25 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = mrand.Uint64()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.FailRate < 0 || c.FailRate >= 1 {
		return fmt.Errorf("-fail-rate must be in [0, 1)")
	}
	switch c.Broker {
	case "memory":
	case "postgres":
		if c.PostgresDSN == "" {
			return errors.New("-broker postgres needs -postgres DSN")
		}
	case "rabbitmq":
		if c.RabbitMQURL == "" {
			return errors.New("-broker rabbitmq needs -rabbitmq URL")
		}
		if c.Crash {
			return errors.New("-crash is not supported on RabbitMQ: it redelivers an unacked message only when the consumer's channel closes, and this scenario keeps its connection")
		}
	case "sqs":
		if c.SQSEndpoint == "" {
			return errors.New("-broker sqs needs -sqs ENDPOINT")
		}
	case "jetstream":
		if c.NATSURL == "" {
			return errors.New("-broker jetstream needs -nats URL")
		}
	default:
		return fmt.Errorf("unknown broker %q (want memory, rabbitmq, sqs, postgres or jetstream)", c.Broker)
	}
	return nil
}

// deadLetter is one dead-lettered job of the run.
type deadLetter struct {
	MessageID string
	Key       string
	Reason    string
	Cause     error // the handler's error, for errors.Is
}

// summary is what a run did.
type summary struct {
	Broker, Store, Cache          string
	Orders, Published, Duplicates int
	Poison                        int
	Deliveries, Acked, Retried    int64
	Released, DeadLettered        int64
	InjectedFailures, DroppedAcks int64
	AlreadyCharged, LockBusy      int64
	DeadLetters                   []deadLetter
	Guard                         idempotency.StatsSnapshot
	Charges                       map[string]int // per order
	NotCharged                    []string
	ChargedTwice                  int
	Elapsed                       time.Duration
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// env is what a run opened; close releases it.
type env struct {
	broker  sdk.Broker
	lease   time.Duration
	queue   string
	store   idempotency.Store
	cache   idempotency.Cache
	ledger  ledger
	closers []func()
}

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

func open(ctx context.Context, c *config) (*env, error) {
	e := &env{queue: "billing-" + randHex(4), lease: time.Second}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	var pool *pgxpool.Pool
	schema := "billing_" + randHex(4)
	if c.PostgresDSN != "" {
		cfg, err := pgxpool.ParseConfig(c.PostgresDSN)
		if err != nil {
			return nil, errors.New("postgres: invalid DSN") // pgx errors may quote it
		}
		cfg.MaxConns = int32(c.Workers*c.Concurrency + 4)
		if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return nil, errors.New("postgres: invalid DSN")
		}
		e.closers = append(e.closers, pool.Close)
		if err := pool.Ping(ctx); err != nil {
			return nil, fmt.Errorf("postgres: cannot connect: %w", err)
		}
		if !c.Keep {
			e.closers = append(e.closers, func() {
				_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			})
		}
		s, err := pgstore.New(pool, pgstore.Options{Schema: schema})
		if err != nil {
			return nil, err
		}
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
		if e.ledger, err = newPGLedger(ctx, pool, schema); err != nil {
			return nil, err
		}
		e.store = s
	} else {
		e.store = memstore.New(memstore.Options{})
		e.ledger = newMemLedger()
	}

	if c.RedisAddr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: c.RedisAddr, MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		e.closers = append(e.closers, func() { _ = rdb.Close() })
		if err := rdb.Ping(ctx).Err(); err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		prefix := "berth:billing:" + randHex(4) + ":"
		cache, err := redisstore.New(rdb, redisstore.Options{Prefix: prefix})
		if err != nil {
			return nil, err
		}
		if !c.Keep {
			e.closers = append(e.closers, func() { deletePrefix(rdb, prefix) })
		}
		e.cache = cache
	}

	switch c.Broker {
	case "memory":
		b, err := memory.New(memory.Options{Lease: e.lease})
		if err != nil {
			return nil, err
		}
		e.broker = b
	case "postgres":
		e.lease = 2 * time.Second
		b, err := postgres.New(pool, postgres.Options{Schema: schema, Lease: e.lease, PollInterval: 200 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		if err := b.Migrate(ctx); err != nil {
			_ = b.Close()
			return nil, err
		}
		e.broker = b
	case "rabbitmq":
		e.lease = 30 * time.Second
		b, err := rabbitmq.New(ctx, c.RabbitMQURL, rabbitmq.Options{ConnectionName: "berth-billing-example"})
		if err != nil {
			return nil, err
		}
		e.broker = b
		if !c.Keep {
			e.closers = append(e.closers, func() { _ = b.DeleteQueue(context.Background(), e.queue) })
		}
	case "sqs":
		e.lease = 2 * time.Second
		u, err := url.Parse(c.SQSEndpoint)
		if err != nil || u.Host == "" {
			return nil, errors.New("sqs: -sqs must be the endpoint URL, e.g. http://127.0.0.1:4566")
		}
		cfg, err := awsconfig.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("sqs: AWS configuration: %w", err)
		}
		if cfg.Region == "" {
			cfg.Region = "us-east-1"
		}
		if ip := net.ParseIP(u.Hostname()); u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback()) {
			cfg.Credentials = credentials.NewStaticCredentialsProvider("berth", "berth", "")
		}
		b, err := sqs.NewFromConfig(cfg, sqs.Options{VisibilityTimeout: e.lease, WaitTime: time.Second, SyncAck: true},
			func(o *awssqs.Options) { o.BaseEndpoint = aws.String(c.SQSEndpoint) })
		if err != nil {
			return nil, err
		}
		e.broker = b
		if !c.Keep {
			e.closers = append(e.closers, func() { _ = b.DeleteQueue(context.Background(), e.queue, true) })
		}
	case "jetstream":
		e.lease = 2 * time.Second
		nc, err := nats.Connect(c.NATSURL, nats.Name("berth-billing-example"), nats.MaxReconnects(-1))
		if err != nil {
			return nil, fmt.Errorf("jetstream: %w", err)
		}
		e.closers = append(e.closers, nc.Close)
		opts := jetstream.Options{AckWait: e.lease, WaitTime: time.Second, Logger: c.Logger}
		b, err := jetstream.New(nc, opts)
		if err != nil {
			return nil, err
		}
		e.broker = b
		if !c.Keep { // runs after the broker's Close, on the connection it leaves open
			e.closers = append(e.closers, func() {
				if d, err := jetstream.New(nc, opts); err == nil {
					_ = d.DeleteQueue(context.Background(), e.queue)
					_ = d.Close()
				}
			})
		}
	}
	e.closers = append(e.closers, func() { _ = e.broker.Close() })
	if d, ok := e.broker.(sdk.QueueDeclarer); ok {
		if err := d.DeclareQueue(ctx, e.queue); err != nil {
			return nil, fmt.Errorf("declare queue: %w", err)
		}
	}
	ok = true
	return e, nil
}

// run plays the scenario and writes the summary to out.
func run(ctx context.Context, c config, out io.Writer) (*summary, error) {
	if err := c.defaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	ctx, cancel := context.WithTimeoutCause(ctx, c.Timeout, fmt.Errorf("did not finish within %s (-timeout)", c.Timeout))
	defer cancel()
	e, err := open(ctx, &c)
	if err != nil {
		return nil, err
	}
	defer e.close()

	s := &summary{Broker: c.Broker, Store: "memory", Orders: c.Orders}
	if c.PostgresDSN != "" {
		s.Store = "postgres"
	}
	s.Cache = "none"
	if c.RedisAddr != "" {
		s.Cache = "redis"
	}
	rng := mrand.New(mrand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15))

	// The orders, and their charge jobs: some published twice (one copy at
	// once, one later), and one poison job whose payload is invalid.
	orders := make([]order, c.Orders)
	for i := range orders {
		orders[i] = order{ID: fmt.Sprintf("order_%03d", i+1), Status: "pending", AmountCents: 1000 + 25*i}
	}
	if err := e.ledger.Seed(ctx, orders); err != nil {
		return nil, fmt.Errorf("seed orders: %w", err)
	}
	var msgs []*sdk.Message
	for i, o := range orders {
		m, err := sdk.NewJSON(jobType, chargeJob{OrderID: o.ID, AmountCents: o.AmountCents})
		if err != nil {
			return nil, err
		}
		m.IdempotencyKey = chargeKey(o.ID)
		msgs = append(msgs, m)
		if (i+1)%c.DupEvery == 0 {
			dup := m.Clone()
			if i%2 == 0 { // half the duplicates arrive later, after the charge
				dup.Delay = time.Duration(200+rng.IntN(300)) * time.Millisecond
			}
			msgs = append(msgs, dup)
			s.Duplicates++
		}
	}
	poison := &sdk.Message{Type: jobType, IdempotencyKey: chargeKey("order_poison"), Body: []byte(`{"order_id": 42, "amount_cents": "twelve"}`)}
	msgs = append(msgs, poison)
	s.Poison = 1
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	s.Published = len(msgs)

	// The tracker sees every settlement that reaches the broker.
	tr := newTracker(e.broker, c.Crash, rng.Uint64(), len(msgs))
	var stats idempotency.Stats
	guard, err := idempotency.New(idempotency.Options{Store: e.store, Cache: e.cache, Mode: idempotency.Transactional, Stats: &stats, InProgressDelay: 50 * time.Millisecond, Logger: c.Logger})
	if err != nil {
		return nil, err
	}
	h := &chargeHandler{ledger: e.ledger, failRate: c.FailRate, rng: mrand.New(mrand.NewPCG(rng.Uint64(), 1))}
	locks := &orderLocks{held: map[string]bool{}}
	mws := []sdk.Middleware{}
	if c.Lock {
		mws = append(mws, locks.middleware)
	}
	mws = append(mws, guard.Middleware())
	counts := &settleCounter{}

	if err := e.broker.Publish(ctx, e.queue, msgs...); err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}

	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, c.Workers)
	for i := range c.Workers {
		w, err := sdk.NewWorker(tr.subscriber(), sdk.JSON(h.handle), sdk.WorkerOptions{
			Queue:        e.queue,
			Concurrency:  c.Concurrency,
			Lease:        e.lease,
			Retry:        sdk.RetryPolicy{MaxAttempts: 5, Backoff: sdk.Backoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond}},
			DrainTimeout: 5 * time.Second,
			Middleware:   mws,
			Observers:    []sdk.Observer{counts},
			Logger:       c.Logger.With("worker", i),
			Rand:         mrand.New(mrand.NewPCG(rng.Uint64(), uint64(i))),
		})
		if err != nil {
			stop()
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(wctx); err != nil && !errors.Is(err, context.Canceled) {
				errs <- err
			}
		}()
	}
	var waitErr error
	select {
	case <-tr.allDone:
	case <-ctx.Done():
		// The cause: -timeout ran out, or main's context was cancelled
		// (Ctrl-C: "interrupt signal received").
		waitErr = fmt.Errorf("scenario stopped: %v: %d of %d jobs settled", context.Cause(ctx), tr.settled(), len(msgs))
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		waitErr = errors.Join(waitErr, err)
	}

	s.Deliveries = counts.started.Load()
	s.Acked = tr.acked.Load()
	s.Retried = counts.retried.Load()
	s.Released = counts.released.Load()
	s.DeadLettered = tr.deadCount.Load()
	s.DeadLetters = tr.deadLetters()
	s.DroppedAcks = tr.dropped.Load()
	s.InjectedFailures = h.injected.Load()
	s.AlreadyCharged = h.already.Load()
	s.LockBusy = locks.busy.Load()
	s.Guard = stats.Snapshot()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if s.Charges, err = e.ledger.ChargeCounts(cctx); err != nil {
		return nil, errors.Join(waitErr, err)
	}
	for _, o := range orders {
		switch n := s.Charges[o.ID]; {
		case n == 0:
			s.NotCharged = append(s.NotCharged, o.ID)
		case n > 1:
			s.ChargedTwice++
		}
	}
	s.Elapsed = time.Since(start)
	s.print(out, c)
	return s, waitErr
}

// settleCounter is a Worker observer counting deliveries and settlements.
type settleCounter struct {
	started, retried, released atomic.Int64
}

func (o *settleCounter) Start(ctx context.Context, _ sdk.Delivery) context.Context {
	o.started.Add(1)
	return ctx
}

func (o *settleCounter) Settled(_ context.Context, _ sdk.Delivery, st sdk.Settlement) {
	switch st.Action {
	case sdk.ActionRetry:
		o.retried.Add(1)
	case sdk.ActionRelease:
		o.released.Add(1)
	}
}

func (s *summary) print(w io.Writer, c config) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("billing scenario: broker=%s store=%s cache=%s workers=%dx%d seed=%d crash=%v lock=%v", s.Broker, s.Store, s.Cache, c.Workers, c.Concurrency, c.Seed, c.Crash, c.Lock)
	p("jobs published:        %d (%d orders, %d published twice, %d poison)", s.Published, s.Orders, s.Duplicates, s.Poison)
	p("deliveries:            %d", s.Deliveries)
	p("acked:                 %d", s.Acked)
	p("retries:               %d (injected transient failures: %d; released while in progress or locked: %d)", s.Retried, s.InjectedFailures, s.Released)
	if c.Crash {
		p("acks lost to crashes:  %d (redelivered after the lease)", s.DroppedAcks)
	}
	p("dead-lettered:         %d", s.DeadLettered)
	for _, d := range s.DeadLetters {
		p("  - %s (key %s): %s", d.MessageID, d.Key, d.Reason)
	}
	g := s.Guard
	p("idempotency:           %d executed, %d duplicates suppressed (%d by the Redis cache), %d key conflicts, %d in-progress collisions, %d lease takeovers",
		g.Executed, g.DuplicatesSuppressed, g.CacheHits, g.KeyConflicts, g.InProgressCollisions, g.LeaseTakeovers)
	p("already charged:       %d (recorded and acked)", s.AlreadyCharged)
	byCount := map[int]int{}
	for i := 1; i <= s.Orders; i++ {
		byCount[s.Charges[fmt.Sprintf("order_%03d", i)]]++
	}
	var ks []int
	for k := range byCount {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%d orders charged %d time(s)", byCount[k], k))
	}
	p("charges per order:     %s", strings.Join(parts, ", "))
	var line []string
	for i, id := range sortedKeys(s.Charges) {
		line = append(line, fmt.Sprintf("%s=%d", strings.TrimPrefix(id, "order_"), s.Charges[id]))
		if (i+1)%15 == 0 {
			p("  %s", strings.Join(line, " "))
			line = line[:0]
		}
	}
	if len(line) > 0 {
		p("  %s", strings.Join(line, " "))
	}
	if len(s.NotCharged) > 0 {
		p("orders never charged:  %d %v", len(s.NotCharged), s.NotCharged)
	}
	p("elapsed:               %s", s.Elapsed.Round(time.Millisecond))
	p("orders charged twice:  %d", s.ChargedTwice)
}

// deletePrefix deletes the run's cache keys.
func deletePrefix(rdb *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		_ = rdb.Del(ctx, iter.Val()).Err()
	}
}
