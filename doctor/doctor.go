// Package doctor checks a berth deployment for the misconfigurations that
// look fine until a bad day: a broker cap below the Worker's MaxAttempts, a
// classic RabbitMQ queue without a delivery limit, an SQS queue without a
// redrive policy, a PostgreSQL job table without its indexes or with
// autovacuum off, jobs stuck past their lease, a dedupe TTL shorter than the
// redelivery window, a skewed clock. Each check has a stable ID (README.md,
// "berth doctor", lists them; RUNBOOK.md links to them) and returns
// [Finding]s with a severity, the evidence read from the real broker or
// database, and the fix.
//
// Checks read; they never change a queue, a table or a message. The one
// exception is how RabbitMQ arguments are read without the management
// plugin (rabbitmq.Broker.QueueArguments): queue.declare with the queue's own
// arguments, a no-op, on queues that exist.
//
// The command "berth doctor" (cmd/berth) runs [Run] on the broker a URL
// opens, and [RunStores] when that broker cannot be opened or does not
// answer. An SQS broker opens without a request: [Run] itself reports an
// endpoint it cannot reach as doctor.broker-unreachable, with the checks
// of [RunStores] beside it.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/idempotency/redisstore"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// Severity grades a [Finding].
type Severity string

// The severities, from fine to broken. OK findings record a check that ran
// and passed, with its evidence.
const (
	OK    Severity = "ok"
	Info  Severity = "info"  // not a problem, or not checkable here; read it once
	Warn  Severity = "warn"  // works today, fails on a bad day
	Error Severity = "error" // wrong now: jobs are lost, duplicated or stuck
)

// rank orders severities.
func (s Severity) rank() int {
	switch s {
	case Info:
		return 1
	case Warn:
		return 2
	case Error:
		return 3
	}
	return 0
}

// Finding is the result of one check on one queue (or table, or host).
type Finding struct {
	// ID names the check, stable across versions (e.g.
	// "rabbitmq.delivery-limit").
	ID string `json:"id"`
	// Severity is ok, info, warn or error.
	Severity Severity `json:"severity"`
	// Queue is the queue (or "schema.table") checked; "" for host checks.
	Queue string `json:"queue,omitempty"`
	// Summary says what was found, in one line. Summary, Evidence and Fix
	// hold names and errors as they were read (from the broker, its
	// messages, the database), quoted but not escaped: escape them once
	// where they are shown (berth doctor escapes text on the terminal;
	// its -json is JSON).
	Summary string `json:"summary"`
	// Evidence is what was read, with the numbers.
	Evidence string `json:"evidence,omitempty"`
	// Fix says what to change; empty for OK findings.
	Fix string `json:"fix,omitempty"`
}

// Options describe the deployment the broker serves: what the Workers are
// configured with and what the jobs need. The zero value is berth's defaults.
type Options struct {
	// Queues to check. Default: every queue the broker lists (PostgreSQL,
	// JetStream); required for RabbitMQ and SQS.
	Queues []string
	// MaxAttempts is the Workers' RetryPolicy.MaxAttempts. Default
	// [sdk.DefaultMaxAttempts]; a negative one, which [sdk.NewWorker]
	// refuses, is reported as such (the other checks take the default).
	MaxAttempts int
	// LongestJob is the longest a handler is expected to run (its
	// WorkerOptions.Timeout). Default [sdk.DefaultTimeout].
	LongestJob time.Duration
	// Concurrency is the Workers' WorkerOptions.Concurrency. Default 8.
	Concurrency int
	// WorkerPrefetch is the Workers' WorkerOptions.Prefetch: how many
	// deliveries wait, received but not started, beyond the running ones.
	// A Worker holds up to Concurrency + WorkerPrefetch (its capacity).
	// Default (zero) Concurrency, as the Worker's; a negative one, which
	// [sdk.NewWorker] refuses, is reported as such (the other checks take
	// the default).
	WorkerPrefetch int
	// Prefetch is the RabbitMQ consumer prefetch the Workers use (the
	// broker URL's prefetch); 0 is berth's automatic prefetch: the Worker's
	// capacity, at most rabbitmq.DefaultPrefetch (64).
	Prefetch int
	// OldestReady is the age of the oldest ready job above which it is
	// reported as waiting too long. Default 5 min.
	OldestReady time.Duration
	// DeadTuples is the number of dead tuples of the PostgreSQL jobs table
	// above which bloat is reported, when they are also more than a fifth
	// of its rows. Default 100000.
	DeadTuples int64
	// ClockSkew is the clock difference to the database above which it is
	// reported (an error above five times it). Default 1s.
	ClockSkew time.Duration
	// RedeliveryWindow is how long a job may wait in its queue, dead letters
	// waiting for a redrive included, before it runs once more (SQS: the
	// retention period). The checks add the Worker's retry delays. Default 4
	// days (SQS's default retention).
	RedeliveryWindow time.Duration
	// StuckClaims is how long past its lease an idempotency claim in
	// progress is reported as stuck. Default 15 min.
	StuckClaims time.Duration
	// LedgerWindow is the span of job history the ledger checks read (and,
	// for dead-letter growth, the span before it). Default 1h.
	LedgerWindow time.Duration
	// SameError is how many jobs dead-lettered with one transient error make
	// it "retried to exhaustion". Default 3.
	SameError int
	// RetryStorm is how many retrying jobs in the window, more than those
	// that succeeded, make a retry storm. Default 100.
	RetryStorm int
	// DLQGrowth is how many dead letters in the window, more than twice the
	// window before, make the dead-letter queue "growing". Default 10.
	DLQGrowth int
	// Ledger, when set, is read by the ledger checks ([Ledger]). On the
	// PostgreSQL broker Run reads its jobs table when Ledger is nil.
	Ledger ledger.Reader
	// Results, when set, is the database of the idempotency result store,
	// checked by [Idempotency] on ResultsTable (default
	// "public.job_results").
	Results      *pgxpool.Pool
	ResultsTable string
	// Redis, when set, holds the idempotency dedupe cache under RedisPrefix
	// (default "berth:idem:"), checked by [Dedupe].
	Redis       redis.UniversalClient
	RedisPrefix string
	// DrainTimeout and SettleTimeout are the Workers' (defaults
	// sdk.DefaultDrainTimeout and sdk.DefaultSettleTimeout; a negative one,
	// which [sdk.NewWorker] refuses, is reported as such); GracePeriod is
	// the time the platform gives a process between SIGTERM and SIGKILL
	// (default 30s, Kubernetes').
	DrainTimeout, SettleTimeout, GracePeriod time.Duration
	// Now is the worker's clock. Default time.Now.
	Now func() time.Time
	// CheckTimeout bounds each check: one queue's broker checks, the job
	// table's, the ledger's, the idempotency store's, the dedupe cache's.
	// One that does not answer within it is reported as a
	// doctor.check-timeout error finding and the others still run. Default
	// [DefaultCheckTimeout]. The whole run is bounded by ctx only. Scans of
	// a whole table (postgres.queue-unknown's queue names,
	// idempotency.retention's latest results) get a third of it, as their
	// statement_timeout: one cut there is reported as an info finding of
	// that check, and the check's other findings stand.
	CheckTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = sdk.DefaultMaxAttempts
	}
	if o.LongestJob == 0 {
		o.LongestJob = sdk.DefaultTimeout
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.WorkerPrefetch <= 0 {
		o.WorkerPrefetch = o.Concurrency
	}
	if o.OldestReady <= 0 {
		o.OldestReady = 5 * time.Minute
	}
	if o.DeadTuples <= 0 {
		o.DeadTuples = 100000
	}
	if o.ClockSkew <= 0 {
		o.ClockSkew = time.Second
	}
	if o.StuckClaims <= 0 {
		o.StuckClaims = 15 * time.Minute
	}
	if o.LedgerWindow <= 0 {
		o.LedgerWindow = time.Hour
	}
	if o.SameError <= 0 {
		o.SameError = 3
	}
	if o.RetryStorm <= 0 {
		o.RetryStorm = 100
	}
	if o.DLQGrowth <= 0 {
		o.DLQGrowth = 10
	}
	if o.GracePeriod <= 0 {
		o.GracePeriod = 30 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.CheckTimeout <= 0 {
		o.CheckTimeout = DefaultCheckTimeout
	}
	return o
}

// ErrNoQueues is returned by [Run] when no queue was named and the broker
// cannot list its queues.
var ErrNoQueues = errors.New("doctor: name the queues to check (this broker cannot list them)")

// Run runs every check that applies to b (RabbitMQ, SQS, PostgreSQL, JetStream, as
// brokerurl opens them, or the broker types themselves; on others only the
// Worker's options) and
// returns the findings, worst first. An error means the checks could not run
// (the broker cannot be reached); a check that cannot tell is an Info finding.
// A check that does not answer within opts.CheckTimeout, or before ctx's
// deadline, is a doctor.check-timeout error finding naming what did not
// answer, and the other checks still run; a cancelled ctx stops the run.
// Beside the broker's own it runs the checks of [RunStores] (the ledger's,
// on the PostgreSQL broker its jobs table's when opts.Ledger is nil, the
// idempotency result store's, the dedupe cache's) and the Worker's options.
// An SQS endpoint that cannot be reached (see [SQS]: SQS opens without a
// request) is a doctor.broker-unreachable finding, as berth doctor reports
// the other brokers it cannot open: only the checks of [RunStores] run
// beside it (one that does not answer is doctor.check-timeout on each
// queue, beside every other check).
func Run(ctx context.Context, b sdk.Broker, opts Options) ([]Finding, error) {
	o := opts.withDefaults()
	var (
		fs   []Finding
		err  error
		down bool // the broker could not be reached: only the stores' checks run beside it
	)
	switch {
	case asRabbit(b) != nil:
		fs, err = rabbitMQ(ctx, asRabbit(b), o)
	case asSQS(b) != nil:
		fs, down, err = sqsChecks(ctx, asSQS(b), o)
	case asPostgres(b) != nil:
		pg := asPostgres(b)
		fs, err = postgresChecks(ctx, pg.pool, pg.schema, pg.broker.Lease(), o)
	case asJetStream(b) != nil:
		fs, err = jetStream(ctx, asJetStream(b), o)
	default:
		fs = []Finding{{ID: "broker.checks", Severity: Info, Summary: "no broker-specific checks for this broker",
			Evidence: fmt.Sprintf("%T: only the Worker's options are checked against what it reports", b)}}
	}
	if err != nil {
		return fs, err
	}
	lease := time.Duration(0)
	if lr, ok := b.(sdk.LeaseReporter); ok {
		lease = lr.Lease()
	}
	var r ledger.Reader
	if (o.Ledger != nil || asPostgres(b) != nil) && !missingJobsTable(fs) {
		if r = o.Ledger; r == nil {
			pg := asPostgres(b)
			if r, err = pgledger.NewJobs(pg.pool, pg.schema); err != nil {
				return fs, err
			}
		}
	}
	sf, err := stores(ctx, o, r, lease)
	fs = append(fs, sf...)
	if err != nil {
		return fs, err
	}
	if !down {
		fs = append(fs, workerConfig(b, o, opts)...)
	}
	Sort(fs)
	return fs, nil
}

// RunStores runs the checks of [Run] that read no broker: the ledger's
// ([Ledger], on opts.Ledger), the idempotency result store's
// ([Idempotency], on opts.Results) and the dedupe cache's ([Dedupe], on
// opts.Redis), those that are set, each within opts.CheckTimeout as in Run,
// and returns their findings, worst first. It is for when the broker cannot
// be opened or does not answer, when these matter most: berth doctor then
// reports the broker as doctor.broker-unreachable (refused, or not opened)
// or doctor.check-timeout (no answer) and runs them. Without a
// broker the Worker's options, which are checked against it, are not, the
// PostgreSQL broker's jobs table does not stand in for a ledger, and the
// ledger.duration evidence gives no lease. opts.Queues is not read. An
// error means a check failed (not a timeout: that is a finding); a
// cancelled ctx stops the run.
func RunStores(ctx context.Context, opts Options) ([]Finding, error) {
	o := opts.withDefaults()
	fs, err := stores(ctx, o, o.Ledger, leaseUnknown)
	Sort(fs)
	return fs, err
}

// leaseUnknown is the lease [Ledger] is given when there is no broker to
// report one ([RunStores]).
const leaseUnknown = -1

// stores runs the checks of the stores beside the broker, each within
// o.CheckTimeout: the ledger's on r (when not nil; lease is the broker's),
// the idempotency result store's and the dedupe cache's (when o has them).
// It returns the findings made before an error.
func stores(ctx context.Context, o Options, r ledger.Reader, lease time.Duration) ([]Finding, error) {
	var fs []Finding
	if r != nil {
		lf, err := bounded(ctx, o, "ledger checks", "", func(ctx context.Context) ([]Finding, error) { return Ledger(ctx, r, lease, o) })
		if err != nil {
			return fs, err
		}
		fs = append(fs, lf...)
	}
	if o.Results != nil {
		table := o.ResultsTable
		if table == "" {
			table = "public.job_results"
		}
		rf, err := bounded(ctx, o, "idempotency result store checks", table, func(ctx context.Context) ([]Finding, error) {
			return Idempotency(ctx, o.Results, o.ResultsTable, o)
		})
		if err != nil {
			return fs, err
		}
		fs = append(fs, rf...)
	}
	if o.Redis != nil {
		prefix := o.RedisPrefix
		if prefix == "" {
			prefix = redisstore.DefaultPrefix
		}
		rf, err := bounded(ctx, o, "Redis dedupe cache checks", prefix+"*", func(ctx context.Context) ([]Finding, error) {
			return Dedupe(ctx, o.Redis, o.RedisPrefix, o)
		})
		if err != nil {
			return fs, err
		}
		fs = append(fs, rf...)
	}
	return fs, nil
}

// workerConfig runs sdk.CheckConfig for the Worker the options describe:
// o with doctor's defaults, raw as given, so that a value NewWorker
// refuses (a negative MaxAttempts, WorkerPrefetch, DrainTimeout or
// SettleTimeout) is reported rather than taken for the default.
func workerConfig(b sdk.Broker, o, raw Options) []Finding {
	wo := sdk.WorkerOptions{Queue: "doctor", Concurrency: o.Concurrency, Prefetch: raw.WorkerPrefetch, Timeout: o.LongestJob,
		Retry: sdk.RetryPolicy{MaxAttempts: raw.MaxAttempts}, DrainTimeout: raw.DrainTimeout, SettleTimeout: raw.SettleTimeout}
	conflicts, err := sdk.CheckConfig(b, wo)
	if err != nil {
		return []Finding{{ID: "worker.options", Severity: Error, Summary: "the Worker options do not validate", Evidence: err.Error(), Fix: "fix the flags"}}
	}
	var out []Finding
	for _, c := range conflicts {
		out = append(out, Finding{ID: c.ID, Severity: Warn, Summary: "the Worker's options contradict the broker", Evidence: c.Message, Fix: c.Fix})
	}
	if len(conflicts) == 0 {
		out = append(out, Finding{ID: sdk.ConflictMaxAttemptsOverCap, Severity: OK,
			Summary:  "the Worker's retry policy fits the broker's poison cap",
			Evidence: fmt.Sprintf("MaxAttempts %d%s", o.MaxAttempts, capText(b))})
	}
	return append(out, shutdown(o))
}

// shutdown compares the longest a Worker's shutdown takes with the
// platform's grace period (ARCHITECTURE.md, "Shutdown").
func shutdown(o Options) Finding {
	drain, settle := o.DrainTimeout, o.SettleTimeout
	if drain <= 0 {
		drain = sdk.DefaultDrainTimeout
	}
	if settle <= 0 {
		settle = sdk.DefaultSettleTimeout
	}
	longest := drain + 2*settle + time.Second
	ev := fmt.Sprintf("DrainTimeout %s + 2 × SettleTimeout %s + 1s = %s; grace period %s", drain, settle, longest, o.GracePeriod)
	if longest >= o.GracePeriod {
		return Finding{ID: "worker.drain-over-grace-period", Severity: Warn,
			Summary:  "a Worker's shutdown can outlast the platform's grace period: it is killed mid-drain and its jobs come back with an attempt counted",
			Evidence: ev, Fix: "lower DrainTimeout (or SettleTimeout), or raise the grace period (Kubernetes terminationGracePeriodSeconds)"}
	}
	return Finding{ID: "worker.drain-over-grace-period", Severity: OK, Summary: "a Worker drains within the grace period", Evidence: ev}
}

func capText(b sdk.Broker) string {
	if cr, ok := b.(sdk.DeliveryCapReporter); ok && cr.MaxDeliveries() > 0 {
		return fmt.Sprintf(", broker cap %d", cr.MaxDeliveries())
	}
	return ", no broker cap on retries"
}

// Sort orders findings worst first, then by ID and queue.
func Sort(fs []Finding) {
	slices.SortStableFunc(fs, func(a, b Finding) int {
		if d := b.Severity.rank() - a.Severity.rank(); d != 0 {
			return d
		}
		if a.ID != b.ID {
			if a.ID < b.ID {
				return -1
			}
			return 1
		}
		if a.Queue < b.Queue {
			return -1
		}
		if a.Queue > b.Queue {
			return 1
		}
		return 0
	})
}

// Worst returns the highest severity among fs (OK when empty).
func Worst(fs []Finding) Severity {
	w := OK
	for _, f := range fs {
		if f.Severity.rank() > w.rank() {
			w = f.Severity
		}
	}
	return w
}

// lister is a broker that lists its queues.
type lister interface {
	Queues(ctx context.Context) ([]string, error)
}

// queues returns opts.Queues, else the broker's own list.
func queues(ctx context.Context, b any, o Options) ([]string, error) {
	if len(o.Queues) > 0 {
		return o.Queues, nil
	}
	if l, ok := b.(lister); ok {
		return l.Queues(ctx)
	}
	return nil, ErrNoQueues
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

// missingJobsTable reports whether fs found the PostgreSQL jobs table
// missing: the ledger checks read it, and their error would replace the
// finding that says why (the run must report it, not fail).
func missingJobsTable(fs []Finding) bool {
	for _, f := range fs {
		if f.ID == "postgres.table-missing" && f.Severity == Error {
			return true
		}
	}
	return false
}

// quoted puts s as it is between double quotes. A [Finding] holds text as
// it was read, escaped only where it is shown: %q would escape it here as
// well, so that a backslash read from a queue name or an error showed
// doubled (and escapes as escapes of escapes).
func quoted(s string) string { return `"` + s + `"` }
