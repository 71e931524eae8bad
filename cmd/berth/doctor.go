package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
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

// brokerOutcome says which checks ran without the broker: only those of
// others ("-db and -redis", "-db", "-redis" or "": none).
func brokerOutcome(others string) string {
	if others == "" {
		return "no check was run"
	}
	return "no check of the broker (its queues, the Workers' options) was run, only those of " + others
}

// brokerTimeoutFinding is the doctor.check-timeout finding of a broker
// (-url) whose connection did not answer within d (or before the run's
// deadline, ctx's) with err: without a broker none of its checks runs, nor
// those of the Workers' options; only those of others ("-db and -redis",
// "-db", "-redis" or "": none) do.
func brokerTimeoutFinding(ctx context.Context, d time.Duration, err error, others string) *doctor.Finding {
	outcome := brokerOutcome(others)
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

// brokerDownFinding is the finding of a broker (-url) that could not be
// opened, err the error of opening it within d under ctx, beside the
// checks of others (as for brokerTimeoutFinding): doctor.broker-unreachable
// when the broker refused the connection, its credentials, vhost or
// database, its host name did not resolve or the TLS handshake failed (even
// after the client retried until the deadline, as RabbitMQ's does on a
// refused connection), or when the broker could not be opened for another
// reason; doctor.check-timeout when it did not answer in time. It is nil
// when err is not the broker's: a usage error (a malformed -url, an unknown
// scheme or parameter) or an interrupted run, which stay errors.
func brokerDownFinding(ctx context.Context, d time.Duration, err error, others string) *doctor.Finding {
	var ue *usageError
	if errors.As(err, &ue) || ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return nil
	}
	what, fix := brokerFailure(err)
	if what == "" {
		if dbTimedOut(ctx, err) {
			return brokerTimeoutFinding(ctx, d, err, others)
		}
		what, fix = "could not be opened", "fix what the evidence names: the Workers, given the same URL, cannot connect either"
	} else if errors.Is(err, context.DeadlineExceeded) { // RabbitMQ's client retries a refused connection
		if ctx.Err() != nil {
			what += ", retried until doctor's overall deadline"
		} else {
			what += fmt.Sprintf(", retried for %s (-check-timeout)", d)
		}
	}
	return &doctor.Finding{ID: "doctor.broker-unreachable", Severity: doctor.Error, Queue: "-url",
		Summary:  "the broker of -url " + what + ": " + brokerOutcome(others),
		Evidence: err.Error(), // brokerurl's errors never hold the password
		Fix:      fix}
}

// brokerFailure returns what happened to a connection to the broker that
// failed with err, for a finding's summary, and what to check: "" when err
// is none of the failures it knows.
func brokerFailure(err error) (what, fix string) {
	var (
		dns    *net.DNSError
		record tls.RecordHeaderError
		verify *tls.CertificateVerificationError
		alert  tls.AlertError
		ae     *amqp.Error
		pe     *pgconn.PgError
	)
	switch {
	case errors.As(err, &dns) && !dns.IsTimeout: // a DNS server that did not answer in time is doctor.check-timeout
		return "could not be reached: its host name did not resolve", "check the host name of -url, and the DNS this machine uses"
	case errors.As(err, &record) || errors.As(err, &verify) || errors.As(err, &alert) ||
		errors.Is(err, nats.ErrSecureConnWanted) || errors.Is(err, nats.ErrSecureConnRequired):
		return "failed the TLS handshake",
			"check that -url asks for TLS where the server's port speaks it (amqps://, nats:// tls=true, PostgreSQL's sslmode) and that this machine trusts the server's certificate for -url's host name"
	case errors.As(err, &ae) && ae.Code == amqp.AccessRefused,
		errors.As(err, &pe) && (pe.Code == "28P01" || pe.Code == "28000"),
		errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		return "refused the credentials",
			"check the user and password of -url (or its credentials file) and that the broker lets that user in from this machine (PostgreSQL: pg_hba.conf)"
	case errors.As(err, &ae) && ae.Code == amqp.NotAllowed, errors.As(err, &pe) && pe.Code == "3D000":
		return "refused the vhost or database",
			"check the path of -url: the RabbitMQ vhost or PostgreSQL database must exist and the user must have access to it"
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, nats.ErrNoServers):
		return "refused the connection", "check that the broker is running and that -url names its host and port (a firewall can refuse too)"
	}
	return "", ""
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
	// Opening the broker has -check-timeout too: one that does not answer,
	// refuses the connection or cannot be opened otherwise is a finding,
	// not a bare error, and the checks that need no broker (-db's,
	// -redis's: doctor.RunStores) still run beside it. A malformed -url
	// stays a usage error.
	var brokerFinding *doctor.Finding
	b, err := c.brokerWithin(ctx, c.checkTimeout)
	if err != nil {
		var others []string // the parts checked without the broker
		if dsn != "" {
			others = append(others, "-db")
		}
		if c.redis != "" {
			others = append(others, "-redis")
		}
		if brokerFinding = brokerDownFinding(ctx, c.checkTimeout, err, strings.Join(others, " and ")); brokerFinding == nil {
			return err
		}
		b = nil
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
