package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// config is a chaos run's knobs.
type config struct {
	Broker      string
	Duration    time.Duration // faults injected for this long
	Workers     int
	Rate        int // orders per second
	PostgresDSN string
	RabbitMQURL string
	SQSEndpoint string
	NATSURL     string
	Seed        uint64
	Settle      time.Duration // the workers' time to finish after the faults
	Keep        bool
	Trace       bool    // the workers log every delivery's start and settlement
	FailRate    float64 // transient handler failures after the charge
	Lease       time.Duration
	LogDir      string // where the workers' log goes; default the temporary directory
	// Faults is the fault mix: "mixed" (default: kills, terminated
	// backends, resets, freezes), "rolling" (every worker SIGTERMed and
	// replaced in turn, no injected failures) or "slow" (100 ms added each
	// way on the database and broker paths — 200 ms per round trip — and a
	// reset every 2–4 s).
	Faults string
	// Work is the longest simulated payment call (default 20 ms; 100 ms
	// with the rolling mix, so that a drain finds jobs running).
	Work time.Duration
}

// report is what a run measured; Violations lists broken invariants.
type report struct {
	Valid, Poison, Messages                 int // orders, poison jobs, messages published (duplicates included)
	PublishRetries                          int
	ChargedOnce, ChargedTwice, NeverCharged int
	DeadValid, DeadPoison                   int // distinct idempotency keys in the dead-letter queue
	Leftovers                               int64
	Faults                                  map[string]int
	Drains                                  []time.Duration // SIGTERM to exit, per worker stopped
	Finish                                  time.Duration   // from the last fault to an empty queue
	LateCharges                             int             // charges committed at an attempt above 1
	MaxAttempt                              int             // the highest attempt a charge was committed at
	LeaseLost, Released                     int64           // reported by the workers that exited cleanly
	Violations                              []string
}

// run is one chaos run; it prints the table to out.
func run(ctx context.Context, c config, out io.Writer) (*report, error) {
	if c.Workers <= 0 {
		c.Workers = 3
	}
	if c.Rate <= 0 {
		c.Rate = 20
	}
	if c.Settle <= 0 {
		c.Settle = 2 * time.Minute
	}
	leaseUnset := c.Lease <= 0
	if leaseUnset {
		c.Lease = leaseDflt
	}
	switch c.Faults {
	case "", "mixed":
		c.Faults = "mixed"
	case "rolling":
		c.FailRate = -1 // an attempt consumed must come from the drain alone
		if c.Work <= 0 {
			c.Work = 100 * time.Millisecond
		}
	case "slow":
		if leaseUnset {
			c.Lease = slowLeaseDflt
		}
	default:
		return nil, fmt.Errorf("unknown fault mix %q (want mixed, rolling or slow)", c.Faults)
	}
	if c.FailRate == 0 {
		c.FailRate = 0.03
	}
	c.FailRate = max(c.FailRate, 0)
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	rng := rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15))
	id := fmt.Sprintf("%d", rng.Uint64()%1e10)
	schema, queue := "chaos_"+id, "chaos_"+id

	pool, err := pgxpool.New(ctx, c.PostgresDSN)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	s := pgx.Identifier{schema}.Sanitize()
	ddl := `CREATE SCHEMA ` + s + `;
CREATE TABLE ` + s + `.orders (id text PRIMARY KEY, status text NOT NULL DEFAULT 'pending', version integer NOT NULL DEFAULT 0,
  amount bigint NOT NULL, charged_at timestamptz);
CREATE TABLE ` + s + `.charges (id bigserial PRIMARY KEY, order_id text NOT NULL, amount bigint NOT NULL, attempt int NOT NULL);`
	if _, err := pool.Exec(ctx, ddl); err != nil {
		return nil, err
	}
	if !c.Keep {
		defer func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA `+s+` CASCADE`) }()
	}
	store, err := pgstore.New(pool, pgstore.Options{Schema: schema})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}

	// Fault proxies: the workers reach the database and the broker through them.
	pgURL, err := url.Parse(c.PostgresDSN)
	if err != nil {
		return nil, fmt.Errorf("postgres DSN: %w", err)
	}
	pgProxy, err := integration.NewProxy(hostPort(pgURL, "5432"))
	if err != nil {
		return nil, err
	}
	defer pgProxy.Close()
	app := "berth-chaos-" + id
	childPG := withHost(pgURL, pgProxy.Addr())
	q := childPG.Query()
	q.Set("application_name", app)
	childPG.RawQuery = q.Encode()

	var brokerURL string
	brokerProxy := pgProxy
	switch c.Broker {
	case "rabbitmq":
		brokerURL = c.RabbitMQURL
	case "sqs":
		brokerURL = c.SQSEndpoint
	case "jetstream":
		brokerURL = c.NATSURL
	case "postgres":
	default:
		return nil, fmt.Errorf("unknown broker %q (want %s)", c.Broker, brokerKinds)
	}
	childURL := ""
	if brokerURL != "" {
		u, err := url.Parse(brokerURL)
		if err != nil {
			return nil, fmt.Errorf("broker URL: %w", err)
		}
		def := map[string]string{"rabbitmq": "5672", "sqs": "80", "jetstream": "4222"}[c.Broker]
		brokerProxy, err = integration.NewProxy(hostPort(u, def))
		if err != nil {
			return nil, err
		}
		defer brokerProxy.Close()
		childURL = withHost(u, brokerProxy.Addr()).String()
	}

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	b, err := openBroker(ctx, c.Broker, brokerURL, pool, schema, c.Lease, client)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Broker, err)
	}
	defer b.Close()
	if d, ok := b.(sdk.QueueDeclarer); ok {
		if err := d.DeclareQueue(ctx, queue); err != nil {
			return nil, err
		}
	}
	if !c.Keep {
		defer deleteQueue(b, queue)
	}

	logFile, err := os.CreateTemp(c.LogDir, "berth-chaos-"+id+"-*.log")
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	env := append(os.Environ(), envChild+"=1", envBroker+"="+c.Broker, envQueue+"="+queue, envSchema+"="+schema,
		envPG+"="+childPG.String(), envURL+"="+childURL, envFail+"="+fmt.Sprint(c.FailRate), envOut+"="+c.Lease.String(), envWork+"="+c.Work.String())
	if c.Trace {
		env = append(env, envTrace+"=1")
	}
	ws := &workers{exe: exe, env: env, log: logFile}
	defer ws.killAll()
	for range c.Workers {
		if err := ws.start(); err != nil {
			return nil, err
		}
	}

	rep := &report{Faults: map[string]int{}}
	fmt.Fprintf(out, "chaos: broker=%s faults=%s duration=%v workers=%d rate=%d/s seed=%d schema=%s queue=%s\nworker log: %s\n",
		c.Broker, c.Faults, c.Duration, c.Workers, c.Rate, c.Seed, schema, queue, logFile.Name())
	if c.Faults == "slow" {
		pgProxy.SetLatency(100 * time.Millisecond)
		brokerProxy.SetLatency(100 * time.Millisecond)
	}

	// Publisher and fault injector, both until the duration ends.
	faultCtx, stopFaults := context.WithTimeout(ctx, c.Duration)
	defer stopFaults()
	var wg sync.WaitGroup
	var pubErr error
	wg.Go(func() {
		pubErr = publish(faultCtx, pool, b, schema, queue, c.Rate, rand.New(rand.NewPCG(c.Seed+1, 7)), rep)
	})
	wg.Go(func() {
		frng := rand.New(rand.NewPCG(c.Seed+2, 9))
		switch c.Faults {
		case "rolling":
			rolling(faultCtx, frng, ws, rep)
		case "slow":
			slow(faultCtx, frng, pgProxy, brokerProxy, c.Broker, rep)
		default:
			inject(faultCtx, frng, ws, pool, app, pgProxy, brokerProxy, c.Broker, rep)
		}
	})
	wg.Wait()
	if pubErr != nil && ctx.Err() == nil {
		return nil, fmt.Errorf("publish: %w", pubErr)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	pgProxy.Thaw()
	brokerProxy.Thaw()
	pgProxy.SetLatency(0)
	brokerProxy.SetLatency(0)
	for ws.count() < c.Workers {
		if err := ws.start(); err != nil {
			return nil, err
		}
	}

	// Let the workers finish: every valid order paid, the queue empty.
	fmt.Fprintf(out, "faults stopped; waiting up to %v for the workers to finish\n", c.Settle)
	// Idle means idle for quietFor: a RabbitMQ worker's delay movers hold
	// retries (up to the 1s bucket here) where no other process's Stats
	// sees them, as every broker's in-flight deliveries are unseen.
	const quietFor = 2 * time.Second
	finished := time.Now()
	deadline := finished.Add(c.Settle)
	var idleSince time.Time
	for time.Now().Before(deadline) && ctx.Err() == nil {
		paid, err := countPaid(ctx, pool, schema)
		st, serr := b.(sdk.Inspector).Stats(ctx, queue)
		if err == nil && serr == nil && paid == rep.Valid && st.Ready+st.InFlight+st.Delayed == 0 {
			if idleSince.IsZero() {
				idleSince = time.Now()
			}
			if time.Since(idleSince) >= quietFor {
				break
			}
		} else {
			idleSince = time.Time{}
		}
		time.Sleep(500 * time.Millisecond)
	}
	rep.Finish = time.Since(finished)
	if !idleSince.IsZero() {
		rep.Finish = idleSince.Sub(finished) // the quiet window is the check's, not the workers'
	}
	if _, ok := b.(*sqs.Broker); ok { // its counters lag: let them catch up
		time.Sleep(2 * time.Second)
	}
	rep.Drains = append(rep.Drains, ws.stopAll()...)
	rep.LeaseLost, rep.Released = ws.leaseLost.Load(), ws.released.Load()
	if err := measure(ctx, pool, b, schema, queue, c, rep); err != nil {
		return nil, err
	}
	rep.print(out)
	return rep, nil
}

func hostPort(u *url.URL, def string) string {
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), def)
	}
	return u.Host
}

func withHost(u *url.URL, hostport string) *url.URL {
	c := *u
	c.Host = hostport
	return &c
}

func deleteQueue(b sdk.Broker, queue string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch b := b.(type) {
	case *sqs.Broker:
		_ = b.DeleteQueue(ctx, queue, true)
	case interface {
		DeleteQueue(context.Context, string) error
	}:
		_ = b.DeleteQueue(ctx, queue)
	}
}

// publish creates an order and publishes its charge job rate times a
// second; every fourth job twice, every twentieth order followed by a
// poison job. A failed Publish is retried with the same messages (same
// IDs): at worst a transport duplicate, which the guard absorbs.
func publish(ctx context.Context, pool *pgxpool.Pool, b sdk.Broker, schema, queue string, rate int, rng *rand.Rand, rep *report) error {
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		c := charge{OrderID: fmt.Sprintf("order_%d", i), Amount: int64(100 + rng.IntN(10000))}
		// Not ctx: an insert cut by the end of the run could commit and
		// still report an error, leaving an order without a job.
		ictx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := pool.Exec(ictx, `INSERT INTO `+orders+` (id, amount) VALUES ($1, $2)`, c.OrderID, c.Amount)
		cancel()
		if err != nil {
			return err
		}
		var msgs []*sdk.Message
		copies := 1
		if i%4 == 0 {
			copies = 2
		}
		for range copies {
			m, err := sdk.NewJSON(chargeTyp, c)
			if err != nil {
				return err
			}
			m.IdempotencyKey = "charge:" + c.OrderID + ":v1"
			msgs = append(msgs, m)
		}
		poison := 0
		if i%20 == 19 {
			poison = 1
			if (i/20)%2 == 0 {
				msgs = append(msgs, &sdk.Message{Type: chargeTyp, IdempotencyKey: fmt.Sprintf("poison:garbled_%d", i), Body: []byte("{not json")})
			} else {
				m, _ := sdk.NewJSON(chargeTyp, charge{OrderID: fmt.Sprintf("missing_%d", i), Amount: 1})
				m.IdempotencyKey = fmt.Sprintf("poison:missing_%d", i)
				msgs = append(msgs, m)
			}
		}
		// Published from this process, not through the proxies: the
		// invariants count what was confirmed.
		for try := 0; ; try++ {
			pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := b.Publish(pctx, queue, msgs...)
			cancel()
			if err == nil {
				break
			}
			if try >= 10 {
				return err
			}
			rep.PublishRetries++
			time.Sleep(200 * time.Millisecond)
		}
		rep.Valid++
		rep.Poison += poison
		rep.Messages += len(msgs)
	}
}

// rolling SIGTERMs the oldest worker and starts its replacement every
// 0.4–1 s, so that every worker is replaced again and again under load.
func rolling(ctx context.Context, rng *rand.Rand, ws *workers, rep *report) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(400*time.Millisecond + time.Duration(rng.IntN(600))*time.Millisecond):
		}
		if d, ok := ws.termOldest(); ok {
			rep.Faults["worker SIGTERM (rolling)"]++
			rep.Drains = append(rep.Drains, d)
		}
		_ = ws.start()
	}
}

// slow resets every connection through one of the proxies every 2–4 s,
// the broker's and the database's in turn (a random pick left one path
// untouched in some 10-second runs); the latency is set by run.
func slow(ctx context.Context, rng *rand.Rand, pgProxy, brokerProxy *integration.Proxy, kind string, rep *report) {
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2*time.Second + time.Duration(rng.IntN(2000))*time.Millisecond):
		}
		if kind == "postgres" || i%2 == 1 {
			pgProxy.Reset()
			rep.Faults["db proxy reset"]++
		} else {
			brokerProxy.Reset()
			rep.Faults["broker proxy reset"]++
		}
	}
}

// inject breaks something every 0.3–1.5 s until ctx ends.
func inject(ctx context.Context, rng *rand.Rand, ws *workers, pool *pgxpool.Pool, app string, pgProxy, brokerProxy *integration.Proxy, kind string, rep *report) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(300*time.Millisecond + time.Duration(rng.IntN(1200))*time.Millisecond):
		}
		switch f := rng.IntN(7); f {
		case 0, 1:
			if ws.kill(rng, syscall.SIGKILL) {
				rep.Faults["worker SIGKILL"]++
			}
			_ = ws.start()
		case 2:
			if d, ok := ws.term(rng); ok {
				rep.Faults["worker SIGTERM"]++
				rep.Drains = append(rep.Drains, d)
			}
			_ = ws.start()
		case 3:
			var n int
			err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE application_name = $1 AND pid <> pg_backend_pid() AND random() < 0.5`, app).Scan(&n)
			if err == nil {
				rep.Faults["db backends terminated"] += n
			}
		case 4:
			if kind == "postgres" || rng.IntN(2) == 0 {
				pgProxy.Reset()
				rep.Faults["db proxy reset"]++
			} else {
				brokerProxy.Reset()
				rep.Faults["broker proxy reset"]++
			}
		case 5, 6:
			p, name := pgProxy, "db proxy freeze"
			if kind != "postgres" && rng.IntN(2) == 0 {
				p, name = brokerProxy, "broker proxy freeze"
			}
			p.Freeze()
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(200+rng.IntN(1800)) * time.Millisecond):
			}
			p.Thaw()
			rep.Faults[name]++
		}
	}
}

func countPaid(ctx context.Context, pool *pgxpool.Pool, schema string) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "orders"}.Sanitize()+` WHERE status = 'paid'`).Scan(&n)
	return n, err
}

// measure reads the invariants from the database and the broker.
func measure(ctx context.Context, pool *pgxpool.Pool, b sdk.Broker, schema, queue string, c config, rep *report) error {
	s := pgx.Identifier{schema}.Sanitize()
	err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE n = 1), count(*) FILTER (WHERE n > 1), count(*) FILTER (WHERE n = 0)
FROM (SELECT o.id, count(c.id) AS n FROM `+s+`.orders o LEFT JOIN `+s+`.charges c ON c.order_id = o.id GROUP BY o.id) x`).
		Scan(&rep.ChargedOnce, &rep.ChargedTwice, &rep.NeverCharged)
	if err != nil {
		return err
	}
	var wrongAmount, notPaid int
	err = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+s+`.charges c JOIN `+s+`.orders o ON o.id = c.order_id WHERE c.amount <> o.amount),
  (SELECT count(*) FROM `+s+`.orders WHERE status <> 'paid' OR version <> 1)`).Scan(&wrongAmount, &notPaid)
	if err != nil {
		return err
	}
	err = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE attempt > 1), coalesce(max(attempt), 0) FROM `+s+`.charges`).Scan(&rep.LateCharges, &rep.MaxAttempt)
	if err != nil {
		return err
	}
	dl, err := b.(sdk.DeadLetters).ListDeadLetters(ctx, queue, 100000)
	if err != nil {
		return fmt.Errorf("list dead letters: %w", err)
	}
	valid, poison := map[string]bool{}, map[string]bool{}
	for _, m := range dl {
		if strings.HasPrefix(m.IdempotencyKey, "poison:") {
			poison[m.IdempotencyKey] = true
		} else {
			valid[m.IdempotencyKey] = true
		}
	}
	rep.DeadValid, rep.DeadPoison = len(valid), len(poison)
	st, err := b.(sdk.Inspector).Stats(ctx, queue)
	if err != nil {
		return err
	}
	rep.Leftovers = st.Ready + st.InFlight + st.Delayed

	v := &rep.Violations
	if rep.ChargedTwice > 0 {
		*v = append(*v, fmt.Sprintf("%d orders charged twice or more", rep.ChargedTwice))
	}
	if rep.NeverCharged > 0 || rep.ChargedOnce != rep.Valid {
		*v = append(*v, fmt.Sprintf("%d orders never charged (charged once: %d of %d)", rep.NeverCharged, rep.ChargedOnce, rep.Valid))
	}
	if wrongAmount > 0 || notPaid > 0 {
		*v = append(*v, fmt.Sprintf("%d charges of the wrong amount, %d orders not paid at version 1", wrongAmount, notPaid))
	}
	if rep.DeadValid > 0 {
		*v = append(*v, fmt.Sprintf("%d valid jobs dead-lettered", rep.DeadValid))
	}
	if rep.DeadPoison != rep.Poison {
		*v = append(*v, fmt.Sprintf("%d of %d poison jobs dead-lettered", rep.DeadPoison, rep.Poison))
	}
	if rep.Leftovers > 0 {
		*v = append(*v, fmt.Sprintf("%d jobs left in the queue", rep.Leftovers))
	}
	// Rolling restarts inject no failure: a charge committed at attempt 2
	// means a drain consumed an attempt. That holds on SQS too, which
	// cannot hand a message back without counting a receive: its Worker
	// runs what it received rather than hand it back, and lets a long poll
	// in flight finish (sdk.LongPoller) rather than cut it off. And on
	// JetStream, which counts every delivery as well: its Release stores a
	// copy carrying the attempt, then acks the original.
	if c.Faults == "rolling" && rep.LateCharges > 0 {
		*v = append(*v, fmt.Sprintf("%d charges committed at an attempt above 1 (max %d): the drain consumed attempts", rep.LateCharges, rep.MaxAttempt))
	}
	// With heartbeats every Lease/3, 200 ms round trips and a reset now and
	// then must not cost a lease. RabbitMQ has no leases: a reset closes
	// the channel and its deliveries go back, reported as lost by design.
	if c.Faults == "slow" && c.Broker != "rabbitmq" && rep.LeaseLost > 0 {
		*v = append(*v, fmt.Sprintf("%d leases lost with heartbeats on", rep.LeaseLost))
	}
	return nil
}

func (r *report) print(out io.Writer) {
	var names []string
	for k := range r.Faults {
		names = append(names, k)
	}
	sort.Strings(names)
	var fs []string
	for _, k := range names {
		fs = append(fs, fmt.Sprintf("%s %d", k, r.Faults[k]))
	}
	fmt.Fprintf(out, "faults: %s\n", strings.Join(fs, ", "))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "invariant\tvalue\twant\n")
	fmt.Fprintf(tw, "orders published\t%d\t\n", r.Valid)
	fmt.Fprintf(tw, "messages published (duplicates, poison)\t%d\t\n", r.Messages)
	fmt.Fprintf(tw, "publish calls retried\t%d\t\n", r.PublishRetries)
	fmt.Fprintf(tw, "charged once\t%d\t%d\n", r.ChargedOnce, r.Valid)
	fmt.Fprintf(tw, "charged twice or more\t%d\t0\n", r.ChargedTwice)
	fmt.Fprintf(tw, "never charged\t%d\t0\n", r.NeverCharged)
	fmt.Fprintf(tw, "dead-lettered valid\t%d\t0\n", r.DeadValid)
	fmt.Fprintf(tw, "dead-lettered poison\t%d\t%d\n", r.DeadPoison, r.Poison)
	fmt.Fprintf(tw, "leftovers in the queue\t%d\t0\n", r.Leftovers)
	fmt.Fprintf(tw, "charges committed at attempt > 1 (max)\t%d (%d)\t\n", r.LateCharges, r.MaxAttempt)
	fmt.Fprintf(tw, "leases lost, released (clean exits)\t%d, %d\t\n", r.LeaseLost, r.Released)
	fmt.Fprintf(tw, "finish after the faults\t%v\t\n", r.Finish.Round(100*time.Millisecond))
	if len(r.Drains) > 0 {
		d := append([]time.Duration(nil), r.Drains...)
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		fmt.Fprintf(tw, "SIGTERM drain (n, min, median, max)\t%d, %v, %v, %v\t\n", len(d),
			d[0].Round(time.Millisecond), d[len(d)/2].Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond))
	}
	_ = tw.Flush()
	if len(r.Violations) == 0 {
		fmt.Fprintln(out, "result: OK")
		return
	}
	for _, v := range r.Violations {
		fmt.Fprintln(out, "VIOLATION:", v)
	}
}

// workers are the child processes.
type workers struct {
	exe string
	env []string
	log *os.File

	mu    sync.Mutex
	procs []*child // oldest first

	leaseLost, released atomic.Int64 // from the "stats" lines of clean exits
}

type child struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// start launches a worker and waits until it is ready (or a few seconds).
func (w *workers) start() error {
	cmd := exec.Command(w.exe)
	cmd.Env = w.env
	cmd.Stderr = w.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() { // owned by c: ends when the child's stdout closes
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			if line == "ready" {
				once.Do(func() { close(ready) })
			}
			var lost, released int64
			if _, err := fmt.Sscanf(line, "stats lease_lost=%d released=%d", &lost, &released); err == nil {
				w.leaseLost.Add(lost)
				w.released.Add(released)
			}
		}
		_ = cmd.Wait()
		close(c.done)
	}()
	w.mu.Lock()
	w.procs = append(w.procs, c)
	w.mu.Unlock()
	select {
	case <-ready:
	case <-c.done:
	case <-time.After(15 * time.Second):
	}
	return nil
}

func (w *workers) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.procs {
		select {
		case <-c.done:
		default:
			n++
		}
	}
	return n
}

// pick removes a random live worker from the set.
func (w *workers) pick(rng *rand.Rand) *child {
	w.mu.Lock()
	defer w.mu.Unlock()
	var live []int
	for i, c := range w.procs {
		select {
		case <-c.done:
		default:
			live = append(live, i)
		}
	}
	if len(live) == 0 {
		return nil
	}
	i := live[rng.IntN(len(live))]
	c := w.procs[i]
	w.procs = append(w.procs[:i], w.procs[i+1:]...)
	return c
}

func (w *workers) kill(rng *rand.Rand, sig syscall.Signal) bool {
	c := w.pick(rng)
	if c == nil {
		return false
	}
	_ = c.cmd.Process.Signal(sig)
	<-c.done
	return true
}

// termOldest SIGTERMs the oldest live worker and times its drain.
func (w *workers) termOldest() (time.Duration, bool) {
	w.mu.Lock()
	var c *child
	for i, p := range w.procs {
		select {
		case <-p.done:
			continue
		default:
		}
		c = p
		w.procs = append(w.procs[:i], w.procs[i+1:]...)
		break
	}
	w.mu.Unlock()
	if c == nil {
		return 0, false
	}
	return c.term(), true
}

// term SIGTERMs a worker and times its drain.
func (w *workers) term(rng *rand.Rand) (time.Duration, bool) {
	c := w.pick(rng)
	if c == nil {
		return 0, false
	}
	return c.term(), true
}

func (c *child) term() time.Duration {
	start := time.Now()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	return time.Since(start)
}

// stopAll SIGTERMs every worker at once and returns their drain times.
func (w *workers) stopAll() []time.Duration {
	w.mu.Lock()
	procs := w.procs
	w.procs = nil
	w.mu.Unlock()
	out := make([]time.Duration, len(procs))
	var wg sync.WaitGroup
	for i, c := range procs {
		wg.Go(func() { out[i] = c.term() })
	}
	wg.Wait()
	return out
}

func (w *workers) killAll() {
	w.mu.Lock()
	procs := w.procs
	w.procs = nil
	w.mu.Unlock()
	for _, c := range procs {
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}
