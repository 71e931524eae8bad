package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// openDB opens and pings the PostgreSQL of dsn (-db).
func (c *cli) openDB(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	return c.openDBFor(ctx, dsn, "")
}

// openDBFor is openDB naming the database in errors ("ledger", "outbox").
func (c *cli) openDBFor(ctx context.Context, dsn, what string) (*pgxpool.Pool, error) {
	return c.openDBWithin(ctx, dsn, what, 30*time.Second)
}

// openDBWithin is openDBFor giving the database d to answer.
func (c *cli) openDBWithin(ctx context.Context, dsn, what string, d time.Duration) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, usagef("-db: the connection string does not parse") // pgx may quote it
	}
	octx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(octx, cfg)
	if err == nil {
		err = pool.Ping(octx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		return nil, fmt.Errorf("%s: %w", strings.TrimSpace(what+" database"), err) // pgx names host, user and database, never the password
	}
	return pool, nil
}

// doctorDB opens -db (dsn) and reports whether the ledger's jobs table is
// in schema, each step within -check-timeout.
func (c *cli) doctorDB(ctx context.Context, dsn, schema string) (*pgxpool.Pool, bool, error) {
	pool, err := c.openDBWithin(ctx, dsn, "", c.checkTimeout)
	if err != nil {
		return nil, false, err
	}
	qctx, cancel := context.WithTimeout(ctx, c.checkTimeout)
	defer cancel()
	var exists bool
	if err := pool.QueryRow(qctx, `SELECT to_regclass($1) IS NOT NULL`,
		pgx.Identifier{schema, pgledger.DefaultPrefix + "jobs"}.Sanitize()).Scan(&exists); err != nil {
		pool.Close()
		return nil, false, fmt.Errorf("ledger database: %w", err)
	}
	return pool, exists, nil
}

// dbTimeoutFinding is the doctor.check-timeout finding of a -db that did
// not answer within d (or before the run's deadline, ctx's) with err.
func dbTimeoutFinding(ctx context.Context, d time.Duration, err error) *doctor.Finding {
	f := &doctor.Finding{ID: "doctor.check-timeout", Severity: doctor.Error, Queue: "-db",
		Summary:  fmt.Sprintf("the database of -db did not answer within %s: its ledger and idempotency checks were not run", d),
		Evidence: err.Error(), // pgx names host, user and database, never the password
		Fix:      "check that the database answers (a hung database stalls the Workers too); if it is only slow, raise -check-timeout"}
	if ctx.Err() != nil {
		f.Summary = "the database of -db did not answer before doctor's overall deadline: its ledger and idempotency checks were not run"
		f.Fix = "check that the database answers; if it is only slow, raise -timeout (the overall deadline)"
	}
	return f
}

// brokerTimeoutFinding is the doctor.check-timeout finding of a broker
// (-url) whose connection did not answer within d (or before the run's
// deadline, ctx's) with err: without a broker none of its checks runs, nor
// those of the Workers' options; only those of others ("-db and -redis",
// "-db", "-redis" or "": none) do.
func brokerTimeoutFinding(ctx context.Context, d time.Duration, err error, others string) *doctor.Finding {
	outcome := "no check was run"
	if others != "" {
		outcome = "no check of the broker (its queues, the Workers' options) was run, only those of " + others
	}
	f := &doctor.Finding{ID: "doctor.check-timeout", Severity: doctor.Error, Queue: "-url",
		Summary:  fmt.Sprintf("the broker of -url did not answer within %s: %s", d, outcome),
		Evidence: err.Error(), // brokerurl's errors never hold the password
		Fix:      "check that the broker answers (a hung broker stalls the Workers too); if it is only slow, raise -check-timeout"}
	if ctx.Err() != nil {
		f.Summary = "the broker of -url did not answer before doctor's overall deadline: " + outcome
		f.Fix = "check that the broker answers; if it is only slow, raise -timeout (the overall deadline)"
	}
	return f
}

// dbTimedOut reports whether err, from opening or querying -db (or opening
// the broker) under ctx, means the server did not answer in time (rather
// than that it refused, or that the run was interrupted).
func dbTimedOut(ctx context.Context, err error) bool {
	if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// errDoctorFindings is returned by "berth doctor" when a finding is an
// error; the findings are printed already, so it exits 1 without a message.
var errDoctorFindings = errors.New("doctor: a finding is an error")

type jsonDoctor struct {
	Findings []doctor.Finding `json:"findings"`
	Worst    doctor.Severity  `json:"worst"`
	Errors   int              `json:"errors"`
	Warnings int              `json:"warnings"`
}

func runDoctor(ctx context.Context, c *cli, args []string) error {
	if c.maxAttempts < 0 || c.concurrency < 0 || c.workerPrefetch < 0 {
		return usagef("-max-attempts, -concurrency and -worker-prefetch must not be negative")
	}
	if c.checkTimeout <= 0 {
		return usagef("-check-timeout must be positive")
	}
	dsn := c.db
	if dsn == "" {
		dsn = c.getenv("BERTH_DB")
	}
	// Opening the broker has -check-timeout too: one that does not answer
	// is a finding, not a bare error, and the checks that need no broker
	// (-db's, -redis's: doctor.RunStores) still run beside it.
	var brokerFinding *doctor.Finding
	b, err := c.brokerWithin(ctx, c.checkTimeout)
	if err != nil {
		if !dbTimedOut(ctx, err) {
			return err
		}
		var others []string // the parts checked without the broker
		if dsn != "" {
			others = append(others, "-db")
		}
		if c.redis != "" {
			others = append(others, "-redis")
		}
		brokerFinding, b = brokerTimeoutFinding(ctx, c.checkTimeout, err, strings.Join(others, " and ")), nil
	} else {
		defer b.Close()
	}
	opts := doctor.Options{Queues: args, MaxAttempts: c.maxAttempts, LongestJob: c.longestJob, Concurrency: c.concurrency,
		WorkerPrefetch: c.workerPrefetch, DrainTimeout: c.drainTimeout, GracePeriod: c.grace, CheckTimeout: c.checkTimeout}
	if u, err := url.Parse(c.url); err == nil { // the workers' RabbitMQ prefetch, from the URL they use
		if p, err := strconv.Atoi(u.Query().Get("prefetch")); err == nil {
			opts.Prefetch = p
		}
	}
	// The application's database (-db): the ledger's tables and the
	// idempotency results. dbFinding: its tables missing, or no answer.
	var dbFinding *doctor.Finding
	if dsn != "" {
		schema := c.schema
		if schema == "" {
			schema = pgledger.DefaultSchema
		}
		// Like a check, the database has -check-timeout to answer: one
		// that does not is a finding, and the broker's checks still run.
		pool, exists, err := c.doctorDB(ctx, dsn, schema)
		switch {
		case err != nil && dbTimedOut(ctx, err):
			dbFinding = dbTimeoutFinding(ctx, c.checkTimeout, err)
		case err != nil:
			return err
		case exists:
			defer pool.Close()
			opts.Results, opts.ResultsTable = pool, c.resultsTable
			s, err := pgledger.New(pool, pgledger.Options{Schema: schema})
			if err != nil {
				return &usageError{err.Error()}
			}
			opts.Ledger = s
		default:
			defer pool.Close()
			opts.Results, opts.ResultsTable = pool, c.resultsTable
			dbFinding = ledgerMissingFinding(schema, c.schema != "", b != nil && isPostgres(b))
		}
	}
	if c.redis != "" {
		rdb := redis.NewClient(&redis.Options{Addr: c.redis})
		defer rdb.Close()
		opts.Redis = rdb
	}
	var fs []doctor.Finding
	if b != nil {
		fs, err = doctor.Run(ctx, b, opts)
	} else {
		fs, err = doctor.RunStores(ctx, opts)
		fs = append(fs, *brokerFinding)
	}
	if errors.Is(err, doctor.ErrNoQueues) {
		return usagef("this broker cannot list its queues: name them (berth doctor QUEUE...)")
	}
	if err != nil {
		return err
	}
	if dbFinding != nil {
		fs = append(fs, *dbFinding)
	}
	doctor.Sort(fs) // worst first, as Run ordered the others
	return c.reportFindings(fs)
}

// reportFindings prints fs (-json: as JSON) and returns errDoctorFindings
// when one is an error.
func (c *cli) reportFindings(fs []doctor.Finding) error {
	var errs, warns int
	for _, f := range fs {
		switch f.Severity {
		case doctor.Error:
			errs++
		case doctor.Warn:
			warns++
		}
	}
	if c.json {
		if err := writeJSON(c.stdout, jsonDoctor{Findings: fs, Worst: doctor.Worst(fs), Errors: errs, Warnings: warns}); err != nil {
			return err
		}
	} else {
		c.printFindings(fs, errs, warns)
	}
	if errs > 0 {
		return errDoctorFindings
	}
	return nil
}

// ANSI colours of the severities, used only when stdout is a terminal.
var severityColour = map[doctor.Severity]string{
	doctor.Error: "\x1b[1;31m", doctor.Warn: "\x1b[33m", doctor.Info: "\x1b[36m", doctor.OK: "\x1b[32m",
}

func (c *cli) printFindings(fs []doctor.Finding, errs, warns int) {
	w := c.stdout
	for _, f := range fs {
		label := fmt.Sprintf("%-5s", f.Severity)
		if c.colour {
			label = severityColour[f.Severity] + label + "\x1b[0m"
		}
		where := ""
		if f.Queue != "" {
			where = "  " + esc(f.Queue)
		}
		fmt.Fprintf(w, "%s  %s%s: %s\n", label, esc(f.ID), where, esc(f.Summary))
		if f.Severity == doctor.OK {
			continue
		}
		if f.Evidence != "" {
			fmt.Fprintf(w, "       evidence: %s\n", esc(f.Evidence))
		}
		if f.Fix != "" {
			fmt.Fprintf(w, "       fix: %s\n", esc(f.Fix))
		}
	}
	fmt.Fprintf(w, "%d checks: %d errors, %d warnings\n", len(fs), errs, warns)
}

// ledgerMissingFinding is the finding of -db without the ledger's tables in
// schema: the ledger checks did not run, which must not look clean — or,
// on the PostgreSQL broker (onPostgres), ran on the broker's jobs table
// instead, which the finding says. Like idempotency.results-missing it is
// info, as -db may name the application's database for the idempotency
// checks alone; a -schema given explicitly asked for the ledger checks, so
// there it is a warning.
func ledgerMissingFinding(schema string, explicit, onPostgres bool) *doctor.Finding {
	table := schema + "." + pgledger.DefaultPrefix + "jobs"
	outcome := "the ledger checks were not run"
	if onPostgres {
		outcome = "the ledger checks read the PostgreSQL broker's jobs table instead"
	}
	f := &doctor.Finding{ID: "ledger.tables-missing", Severity: doctor.Info, Queue: table,
		Summary:  "no ledger tables here: " + outcome,
		Evidence: fmt.Sprintf("no table %s in the database of -db (schema %s)", table, schema),
		Fix:      "point -db at the ledger's database and -schema at its schema (pgledger.Options.Schema, default " + pgledger.DefaultSchema + ")"}
	if explicit {
		f.Severity = doctor.Warn
		f.Summary = "no ledger tables in -schema " + schema + ": " + outcome
	}
	return f
}

// isPostgres reports whether b is the PostgreSQL broker (or wraps it, as
// doctor finds it), whose jobs table the ledger checks read when -db holds
// no ledger.
func isPostgres(b sdk.Broker) bool {
	var pb *postgres.Broker
	if as, ok := b.(interface{ As(any) bool }); ok && as.As(&pb) {
		return true
	}
	_, ok := b.(*postgres.Broker)
	return ok
}
