// Command berth is the operator's tool for berth queues: queue statistics,
// the dead-letter queue (list, show, redrive, purge) and a web dashboard
// (package dashboard), on any broker [brokerurl] opens (RabbitMQ, SQS, PostgreSQL, memory).
//
// Usage:
//
//	berth [flags] <command> [arguments] [flags]
//
//	berth stats -url postgres://localhost/app            every queue
//	berth stats billing emails -watch                    two queues, refreshed
//	berth dlq list billing -reason timeout -limit 20     filtered, paged
//	berth dlq show billing 0192f1d4-...                  one dead letter
//	berth dlq redrive billing -class transient -dry-run  what would be redriven
//	berth dlq redrive billing -class transient -yes      redrive them
//	berth dlq purge billing -older-than 720h -yes        delete old ones
//	berth outbox list -db postgres://localhost/app       parked outbox rows
//	berth job show 0192f1d4-... -db $LEDGER_DSN           one job's state and attempts
//	berth jobs -queue billing -status retrying -since 1h  jobs by queue, status, time
//	berth doctor billing -url amqp://... -max-attempts 8  misconfigurations, with the fix
//	berth queue pause emails -db $BERTH_DB                 pause a queue for every synced Worker
//	berth ui -url mem:// -demo                           the web dashboard
//
// Flags go before or after the command and its arguments; "berth help
// COMMAND" or "berth COMMAND -h" describes one command. The URL may come
// from the BERTH_URL environment variable, which keeps credentials out of
// shell history; it never appears in output or errors. A -url, -db, -table
// or -schema given empty is a usage error, not its default (a script's
// unset variable would otherwise send the command elsewhere).
//
// Exit codes: 0 done; 1 error (broker unreachable, refused); 2 usage (bad
// command line, or a change without -yes and no terminal to confirm on,
// refused before anything is read);
// 3 nothing matched or not found; 4 partial (some chosen dead letters or
// named outbox rows were not changed, the command was interrupted (a
// change interrupted before it changed anything says "nothing changed"), or the broker's scan stopped
// before the end of the dead-letter queue, a dlq list, a -dry-run or the
// count a change asks to confirm too; the output says which and why).
//
// The commands that only read (stats, each refresh of stats -watch, dlq
// list, dlq show, outbox list, job show, jobs, queue paused) give up after
// -timeout, default 1m, as doctor does; the changes and ui have none.
//
// Text output escapes control characters, terminal escape sequences,
// bidirectional-text controls, invisible characters (zero-width, tag
// characters, …) and invalid UTF-8 from messages as Go-style escapes, and
// a backslash as \\, so that an escape always means the character it names
// (a JSON body is shown as JSON, its escapes as they are). An error names
// such text escaped once, by berth or Go-quoted by the package that made it:
// its escapes are printed as they are, and what is still raw in it is
// escaped (errText). In a table, each
// column of such text is cut at a fixed width with a visible "…" (an ID at
// 40 characters, as the dashboard does, with a line under the table saying
// so), so that no message widens every row; -json, dlq show and job show
// give it whole. -json prints one JSON
// document per line (with -watch, one per refresh), with DEL, C1 and
// bidirectional-text controls and invisible characters as \u escapes; its fields are documented in README.md
// ("Operating berth") and only ever gain new fields.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/sdk"
)

// Exit codes.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitNotFound = 3
	exitPartial  = 4
)

// env is what a run of the CLI talks to; tests replace every part.
type env struct {
	stdin       io.Reader
	stdout      io.Writer
	stderr      io.Writer
	interactive bool // stdin and stderr are terminals: confirmations may be asked
	progress    bool // stderr is a terminal: draw progress bars
	colour      bool // stdout is a terminal (and NO_COLOR is unset): colour doctor's severities
	getenv      func(string) string
	open        func(ctx context.Context, rawURL string) (sdk.Broker, error)
	listening   func(addr string) // ui: called with the address once it listens (tests)
	now         func() time.Time  // the clock of jobs -since (tests); nil: time.Now
}

// cliDefaults are the URL parameters the CLI sets unless the URL does: it
// never declares topology and never LISTENs.
var cliDefaults = url.Values{
	"no_declare":      {"true"},
	"connection_name": {"berth-cli"},
	"listen":          {"false"},
}

func openURL(ctx context.Context, rawURL string) (sdk.Broker, error) {
	return brokerurl.Open(ctx, rawURL, brokerurl.Options{Defaults: cliDefaults})
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { // a second signal kills the process the default way
		<-ctx.Done()
		stop()
	}()
	stdinTTY := term.IsTerminal(int(os.Stdin.Fd()))
	stderrTTY := term.IsTerminal(int(os.Stderr.Fd()))
	code := run(ctx, os.Args[1:], env{
		stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr,
		interactive: stdinTTY && stderrTTY, progress: stderrTTY,
		colour: term.IsTerminal(int(os.Stdout.Fd())) && os.Getenv("NO_COLOR") == "",
		getenv: os.Getenv, open: openURL,
	})
	stop()
	os.Exit(code)
}

// command is one verb of the CLI.
type command struct {
	name  string   // "stats", "dlq list", …
	args  string   // its arguments, for usage
	short string   // one line
	long  string   // more, for -h
	flags []string // its own flags (the global ones are always allowed)
	run   func(ctx context.Context, c *cli, args []string) error
	// timeout is the command's -timeout when none is given (0: no limit).
	timeout time.Duration
}

// doctorTimeout is berth doctor's default -timeout: an operator's check
// must end, whatever the servers it reads do.
var doctorTimeout = time.Minute

// readTimeout is the default -timeout of the commands that only read
// (stats, dlq list, dlq show, outbox list, job show, jobs, queue paused):
// a broker or database that takes connections and never answers (an SQS
// endpoint behind a hung proxy, a PostgreSQL waiting on a lock) must not
// hang them for ever. With stats -watch, which runs until interrupted, it
// bounds each refresh instead (a -timeout given bounds the whole watch,
// and each refresh still has this). The commands that change (a redrive of a
// large dead-letter queue takes long) and ui have none.
var readTimeout = time.Minute

var globalFlags = []string{"url", "json", "timeout"}

// targetDefaults are the flags that name where a command reads or changes,
// with what leaving them out means: given, they must not be empty (see run).
var targetDefaults = map[string]string{
	"url":    "$BERTH_URL",
	"db":     "$BERTH_DB",
	"table":  "public.berth_outbox",
	"schema": "the default schema (berth)",
}

func commands() []*command {
	filters := []string{"type", "class", "reason", "older-than", "newer-than"}
	change := append(append([]string{}, filters...), "limit", "dry-run", "yes", "page-size", "scan-limit")
	return []*command{
		{name: "stats", args: "[QUEUE...]", short: "ready, delayed, in flight, dead-lettered, oldest age of queues (all when none is named)",
			flags: []string{"watch", "interval"}, run: runStats, timeout: readTimeout},
		{name: "dlq list", args: "QUEUE", short: "the dead letters of QUEUE matching the filters, a page at a time",
			long: "The line under the table counts every matching dead letter, not just the page shown. When the broker's scan\n" +
				"stopped before the end of the dead-letter queue (SQS: -scan-limit), the list is partial: it exits 4.",
			flags: append(append([]string{}, filters...), "limit", "offset", "scan-limit"), run: runList, timeout: readTimeout},
		{name: "dlq show", args: "QUEUE ID", short: "one dead letter: headers, body, failure history", run: runShow, timeout: readTimeout},
		{name: "dlq redrive", args: "QUEUE [ID...]", short: "put the chosen dead letters (IDs and/or filters; all when none) back on QUEUE, attempts reset",
			long: "Asks for confirmation on a terminal; elsewhere needs -yes. -dry-run shows what would be redriven.\n" +
				"When the broker's scan stopped before the end of the dead-letter queue (SQS: -scan-limit), the count is\n" +
				"partial (\"at least N\"): a change or a -dry-run exits 4. A named ID that is not a dead letter is named (the\n" +
				"first 100, then \"… and N more\") and makes a change or a -dry-run exit 4 (3 when none of them is one and\n" +
				"nothing else matches: a change on a terminal names them too, asking nothing). Put IDs after --\n" +
				"(berth dlq redrive QUEUE -yes -- ID...): an ID read as a flag (-older-than=1ns, or --) would choose more.",
			flags: change, run: func(ctx context.Context, c *cli, a []string) error { return runChange(ctx, c, a, actRedrive) }},
		{name: "dlq purge", args: "QUEUE [ID...]", short: "delete the chosen dead letters (IDs and/or filters; all when none) for good",
			long: "Asks for confirmation on a terminal; elsewhere needs -yes. -dry-run shows what would be deleted.\n" +
				"When the broker's scan stopped before the end of the dead-letter queue (SQS: -scan-limit), the count is\n" +
				"partial (\"at least N\"): a change or a -dry-run exits 4. A named ID that is not a dead letter is named (the\n" +
				"first 100, then \"… and N more\") and makes a change or a -dry-run exit 4 (3 when none of them is one and\n" +
				"nothing else matches: a change on a terminal names them too, asking nothing). Put IDs after --\n" +
				"(berth dlq purge QUEUE -yes -- ID...): an ID read as a flag (-older-than=1ns, or --) would choose more.",
			flags: change, run: func(ctx context.Context, c *cli, a []string) error { return runChange(ctx, c, a, actPurge) }},
		{name: "outbox list", args: "", short: "the outbox rows the relay parked after every attempt failed (-db, -table)",
			flags: []string{"db", "table", "limit"}, run: runOutboxList, timeout: readTimeout},
		{name: "outbox requeue", args: "[ROW-ID...]", short: "put parked outbox rows (all when none is named) back in line for the relay",
			long: "Asks for confirmation on a terminal; elsewhere needs -yes. -dry-run shows what would be requeued.\n" +
				"A named row that is not parked (no such row, or pending: requeued already, or relayed) is left and named\n" +
				"(the first 100, then \"… and N more\"): a change or a -dry-run exits 4, 3 when none of them is parked.",
			flags: []string{"db", "table", "dry-run", "yes"}, run: func(ctx context.Context, c *cli, a []string) error { return runOutboxChange(ctx, c, a, false) }},
		{name: "outbox discard", args: "[ROW-ID...]", short: "delete parked outbox rows (all when none is named): never published",
			long: "Asks for confirmation on a terminal; elsewhere needs -yes. -dry-run shows what would be discarded.\n" +
				"A discard cannot be undone: when a named row is not parked, it discards none of them (exit 3) and names\n" +
				"those that are not (the first 100, then \"… and N more\").",
			flags: []string{"db", "table", "dry-run", "yes"}, run: func(ctx context.Context, c *cli, a []string) error { return runOutboxChange(ctx, c, a, true) }},
		{name: "job show", args: "ID|KEY", short: "one job's state and attempts, from the ledger (-db) or the PostgreSQL broker's jobs table",
			long: "A key several jobs have (an operation published twice) shows the newest of them; the other jobs with the\n" +
				"shown job's idempotency key are named under it (-json: same_key_ids). A -schema of -db that does not exist,\n" +
				"or holds no ledger table, is not found: exit 3.",
			flags: []string{"db", "schema"}, run: runJobShow, timeout: readTimeout},
		{name: "jobs", args: "", short: "jobs by -queue, -status, -type and -since, newest (first seen) first, with the total",
			long: "Reads the ledger in -db (default $BERTH_DB; package ledger), else the jobs table of a PostgreSQL broker's -url.\n" +
				"The next page is -after the cursor printed (give the same filters): with -since it holds the window's start,\n" +
				"so every page reads the window of the first, however much later it is asked for. A -schema of -db that does\n" +
				"not exist, or holds no ledger table, is not found: exit 3.",
			flags: []string{"db", "schema", "queue", "status", "type", "since", "limit", "after"}, run: runJobs, timeout: readTimeout},
		{name: "doctor", args: "[QUEUE...]", short: "check the broker, its queues and the Workers' settings for misconfigurations (exit 1 on an error finding)",
			long: "Each finding has a stable ID (README.md, \"berth doctor\"), a severity (ok, info, warn, error), the evidence and the fix.\n" +
				"Name the queues on RabbitMQ and SQS; PostgreSQL and JetStream check every queue they list.\n" +
				"-max-attempts, -longest-job, -concurrency and -worker-prefetch describe the Workers (defaults: berth's); RabbitMQ's prefetch is read from the URL.\n" +
				"-db (BERTH_DB) adds the ledger checks (its tables in -schema) and the idempotency checks (-results-table, default public.job_results);\n" +
				"-redis HOST:PORT the dedupe cache's. On the PostgreSQL broker the ledger checks read its jobs table.\n" +
				"Each check (one queue's, the ledger's, …) has -check-timeout (default 10s) to answer, else it is reported as doctor.check-timeout\n" +
				"and the others still run; the whole run has -timeout (default 1m; -timeout 0: no limit). A broker whose connection does not\n" +
				"answer within -check-timeout is that finding for -url; one that refuses the connection, its credentials or vhost, or cannot be opened\n" +
				"otherwise is doctor.broker-unreachable: its checks and the Workers' options are not run, -db's and -redis's still are. A malformed\n" +
				"-url is a usage error (exit 2).",
			flags:   []string{"max-attempts", "longest-job", "concurrency", "worker-prefetch", "drain-timeout", "grace-period", "db", "schema", "results-table", "redis", "check-timeout"},
			run:     runDoctor,
			timeout: doctorTimeout},
		{name: "queue pause", args: "QUEUE...", short: "pause queues for every Worker that runs pause.Sync on -db (held jobs finish; the broker is untouched)",
			long: "The pause is a row in -schema.paused_queues (default berth) of -db (default $BERTH_DB); Workers apply it within their sync interval.\n" +
				"A -schema that does not exist is not created: exit 3. The first pause in one that exists creates the table.",
			flags: []string{"db", "schema"}, run: func(ctx context.Context, c *cli, a []string) error { return runQueueChange(ctx, c, a, true) }},
		{name: "queue resume", args: "QUEUE...", short: "resume paused queues",
			long:  "A -schema that does not exist, or holds no pause table (nothing was ever paused there), is not found: exit 3.",
			flags: []string{"db", "schema"}, run: func(ctx context.Context, c *cli, a []string) error { return runQueueChange(ctx, c, a, false) }},
		{name: "queue paused", args: "", short: "the queues paused in -db, with the time of their pause",
			long:  "A -schema that does not exist, or holds no pause table (nothing was ever paused there), is not found: exit 3.",
			flags: []string{"db", "schema"}, run: runQueuePaused, timeout: readTimeout},
		{name: "ui", args: "", short: "serve the web dashboard (http://127.0.0.1:8080 by default)",
			long: "Any address other than loopback needs a token (BERTH_UI_TOKEN, or -token) of at least 16 bytes, e.g. from\n" +
				"openssl rand -hex 16 (a shorter one is a usage error). Every request must then carry it, as a bearer token\n" +
				"or the basic-auth password; wrong tokens are logged (at most one line a second). Without a token only\n" +
				"requests for a loopback host (127.0.0.1, [::1], localhost) are answered. -read-only hides and refuses every change.\n" +
				"-tls-cert and -tls-key (PEM files, both or neither) serve HTTPS; on an address other than loopback\n" +
				"without them the token and the pages cross the network in clear text, and berth ui warns so on stderr\n" +
				"(or put a TLS proxy in front and listen on 127.0.0.1). The files are read at start. Over HTTPS every answer\n" +
				"carries Strict-Transport-Security (max-age one year).\n" +
				"On a broker that cannot list its queues (RabbitMQ, SQS) name them with -queues.\n" +
				"Job pages (/jobs) read the ledger in -db (BERTH_DB), or the PostgreSQL broker's jobs table.\n" +
				"With -db, queue pages also show and change pauses (the table of berth queue pause). A -schema that does not\n" +
				"exist is refused (exit 3, nothing created); one without a ledger table serves no job pages and says so.\n" +
				"A page whose broker does not answer within -request-timeout (default 1m) fails with 503 and says so;\n" +
				"a redrive or purge is not cut by it (each broker call has its own 2m bound). -timeout stops the server.\n" +
				"Ctrl-C stops it: requests in hand get 5s, then a redrive or purge stops after the page it is moving,\n" +
				"which is finished (and logged) before the broker is closed; a second Ctrl-C kills it at once.",
			flags: []string{"addr", "token", "tls-cert", "tls-key", "read-only", "demo", "queues", "db", "schema", "request-timeout"}, run: runUI},
	}
}

// cli holds one run's flags and the broker it opened.
type cli struct {
	env
	fs *flag.FlagSet

	url      string
	json     bool
	timeout  time.Duration
	watch    bool
	interval time.Duration

	types, class, reason  string
	olderThan, newerThan  time.Duration
	limit, offset         int
	pageSize, scanLimit   int
	dryRun, yes           bool
	addr, token, queues   string
	db, table             string
	readOnly, demo        bool
	limitSet, pageSizeSet bool
	schema, queue, status string
	after                 string
	since                 time.Duration
	maxAttempts           int
	concurrency           int
	workerPrefetch        int
	longestJob            time.Duration
	resultsTable, redis   string
	drainTimeout, grace   time.Duration
	checkTimeout          time.Duration
	requestTimeout        time.Duration
	tlsCert, tlsKey       string
	// refreshTimeout bounds each refresh of stats -watch: the command's
	// default -timeout, which bounds the whole watch only when given.
	refreshTimeout time.Duration
}

func newCLI(e env) *cli {
	c := &cli{env: e}
	fs := flag.NewFlagSet("berth", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned and printed once, as they are
	fs.StringVar(&c.url, "url", "", "broker URL: amqp://, amqps://, postgres://, sqs://REGION, http(s)://SQS-ENDPOINT, mem://, nats:// (default $BERTH_URL)")
	fs.BoolVar(&c.json, "json", false, "print JSON, one document per line")
	fs.DurationVar(&c.timeout, "timeout", 0, "give up after this long; 0: no limit (default 1m for the commands that only read, "+
		"and doctor; none for the changes and ui; \"berth COMMAND -h\" says which)")
	fs.BoolVar(&c.watch, "watch", false, "print again every -interval until interrupted")
	fs.DurationVar(&c.interval, "interval", 2*time.Second, "the period of -watch")
	fs.StringVar(&c.types, "type", "", "dlq: only dead letters of these types (comma-separated, exact); jobs: only jobs of this one type (exact)")
	fs.StringVar(&c.class, "class", "", "only dead letters of this error class (permanent, transient, panic, max_deliveries, unknown, …)")
	fs.StringVar(&c.reason, "reason", "", "only dead letters whose reason contains this text, or matches /regexp/")
	fs.DurationVar(&c.olderThan, "older-than", 0, "only dead letters whose last failure is older than this (e.g. 24h)")
	fs.DurationVar(&c.newerThan, "newer-than", 0, "only dead letters whose last failure is newer than this")
	fs.IntVar(&c.limit, "limit", 0, "list, jobs: page size (default 50); redrive, purge: at most this many")
	fs.IntVar(&c.offset, "offset", 0, "skip this many matching dead letters (the next page's offset is printed)")
	fs.IntVar(&c.pageSize, "page-size", 500, "dead letters read and moved per broker call")
	fs.IntVar(&c.scanLimit, "scan-limit", 10000, "on a broker that can neither page nor sweep its dead letters (SQS): read at most this many in one scan (more: say the scan is incomplete)")
	fs.BoolVar(&c.dryRun, "dry-run", false, "print what would be done, change nothing")
	fs.BoolVar(&c.yes, "yes", false, "do it without asking")
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "ui: listen address (not loopback: needs a token)")
	fs.StringVar(&c.token, "token", "", "ui: the token every request must carry, at least 16 bytes (default $BERTH_UI_TOKEN, which keeps it out of ps)")
	fs.BoolVar(&c.readOnly, "read-only", false, "ui: show, never change")
	fs.DurationVar(&c.requestTimeout, "request-timeout", dashboard.DefaultTimeout, "ui: how long a page (or a GET of the API, a confirmation's count, a pause) may wait on the broker before it answers 503")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "ui: serve HTTPS with this certificate (PEM file, chain after it); with -tls-key")
	fs.StringVar(&c.tlsKey, "tls-key", "", "ui: the private key (PEM file) of -tls-cert")
	fs.BoolVar(&c.demo, "demo", false, "ui: with mem://, seed a few queues and dead letters to look at")
	fs.StringVar(&c.queues, "queues", "", "ui: queues to show (comma-separated) besides those the broker lists")
	fs.StringVar(&c.db, "db", "", "outbox, job, jobs, queue, doctor, ui: the application's PostgreSQL, where the outbox, the ledger and the pause table live (default $BERTH_DB)")
	fs.StringVar(&c.table, "table", "", "outbox: the outbox table, [schema.]table (default public.berth_outbox)")
	fs.StringVar(&c.schema, "schema", "", "job, jobs, doctor, ui: the schema of the ledger's tables in -db; queue, ui: of the pause table (default berth)")
	fs.StringVar(&c.queue, "queue", "", "jobs: only jobs of this queue")
	fs.StringVar(&c.status, "status", "", "jobs: only jobs in these statuses (comma-separated: enqueued, running, retrying, released, succeeded, dead, redriven)")
	fs.DurationVar(&c.since, "since", 0, "jobs: only jobs updated in this last while (e.g. 1h)")
	fs.StringVar(&c.after, "after", "", "jobs: the next page, as printed after the previous one (with -since, it keeps the first page's window: the pages neither skip nor repeat a job)")
	fs.IntVar(&c.maxAttempts, "max-attempts", 0, "doctor: the Workers' RetryPolicy.MaxAttempts (default 5)")
	fs.IntVar(&c.concurrency, "concurrency", 0, "doctor: the Workers' Concurrency (default 8)")
	fs.IntVar(&c.workerPrefetch, "worker-prefetch", 0, "doctor: the Workers' Prefetch, received deliveries waiting beyond the running ones (default: Concurrency)")
	fs.DurationVar(&c.longestJob, "longest-job", 0, "doctor: the longest a handler may run, its WorkerOptions.Timeout (default 30m)")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 0, "doctor: the Workers' DrainTimeout (default 15s)")
	fs.DurationVar(&c.grace, "grace-period", 0, "doctor: the platform's grace period between SIGTERM and SIGKILL (default 30s)")
	fs.StringVar(&c.resultsTable, "results-table", "", "doctor: the idempotency result table in -db, schema.table (default public.job_results)")
	fs.StringVar(&c.redis, "redis", "", "doctor: the Redis (host:port) of the idempotency dedupe cache")
	fs.DurationVar(&c.checkTimeout, "check-timeout", doctor.DefaultCheckTimeout, "doctor: how long each check may take to answer before it is reported as not answering")
	c.fs = fs
	return c
}

const usageHead = `usage: berth [flags] <command> [arguments] [flags]

commands:
`

func (c *cli) usage(w io.Writer) {
	fmt.Fprint(w, usageHead)
	for _, cmd := range commands() {
		fmt.Fprintf(w, "  %-30s %s\n", strings.TrimSpace(cmd.name+" "+cmd.args), cmd.short)
	}
	fmt.Fprint(w, "\nflags of every command:\n")
	printFlags(w, c.fs, globalFlags)
	fmt.Fprint(w, "\n\"berth COMMAND -h\" lists a command's own flags.\n"+
		"exit codes: 0 done, 1 error, 2 usage, 3 nothing matched / not found, 4 partial\n")
}

func (c *cli) commandUsage(w io.Writer, cmd *command) {
	fmt.Fprintf(w, "usage: berth %s [flags]\n\n%s\n", strings.TrimSpace(cmd.name+" "+cmd.args), cmd.short)
	if cmd.long != "" {
		fmt.Fprintln(w, cmd.long)
	}
	if len(cmd.flags) > 0 {
		fmt.Fprint(w, "\nflags:\n")
		printFlags(w, c.fs, cmd.flags)
	}
	fmt.Fprint(w, "\nflags of every command:\n")
	printFlags(w, c.fs, globalFlags)
	switch {
	case cmd.timeout > 0 && contains(cmd.flags, "watch"):
		fmt.Fprintf(w, "\n-timeout is %s unless given (with -watch: each refresh; a -timeout given bounds the whole watch, each refresh keeping %s,\n"+
			"and ends it with exit 0 unless a refresh had then waited -interval, at least %s, or none had answered yet: exit 1).\n",
			cmd.timeout, cmd.timeout, hungRefresh)
	case cmd.timeout > 0:
		fmt.Fprintf(w, "\n-timeout is %s unless given.\n", cmd.timeout)
	default:
		fmt.Fprint(w, "\n-timeout is no limit unless given.\n")
	}
}

func run(ctx context.Context, args []string, e env) int {
	c := newCLI(e)
	pos, help, err := parseInterspersed(c.fs, args)
	if err != nil {
		// The flag package quotes a bad value (Go escapes, printed as they
		// are) but not a bad flag's name: an argument such as an ID from a
		// message that starts with "-" would reach the terminal as it is.
		fmt.Fprintf(c.stderr, "berth: %s\n", errText(err))
		fmt.Fprint(c.stderr, "run \"berth -h\" for usage\n")
		return exitUsage
	}
	if len(pos) > 0 && pos[0] == "help" {
		pos, help = pos[1:], true
	}
	cmd, rest := find(pos)
	if help {
		if cmd != nil {
			c.commandUsage(c.stdout, cmd)
		} else {
			c.usage(c.stdout)
		}
		return exitOK
	}
	if cmd == nil {
		if len(pos) == 0 {
			c.usage(c.stderr)
		} else {
			fmt.Fprintf(c.stderr, "berth: unknown command \"%s\"\nrun \"berth -h\" for usage\n", esc(joinWords(pos[:min(2, len(pos))])))
		}
		return exitUsage
	}
	timeoutGiven := false
	for _, name := range flagsGiven(c.fs) {
		timeoutGiven = timeoutGiven || name == "timeout"
		if !contains(globalFlags, name) && !contains(cmd.flags, name) {
			fmt.Fprintf(c.stderr, "berth: -%s does not apply to %q\nrun \"berth %s -h\" for its flags\n", name, cmd.name, cmd.name)
			return exitUsage
		}
		c.limitSet = c.limitSet || name == "limit"
		c.pageSizeSet = c.pageSizeSet || name == "page-size"
		// A target given empty (a script's unset variable: -db "$APP_DB")
		// is not the default: that is another database, broker, table or
		// schema than the one meant, and a change would act there.
		if def, ok := targetDefaults[name]; ok && c.fs.Lookup(name).Value.String() == "" {
			fmt.Fprintf(c.stderr, "berth %s: -%s is empty: give a value, or leave the flag out for %s\n", cmd.name, name, def)
			return exitUsage
		}
	}
	if c.url == "" {
		c.url = c.getenv("BERTH_URL")
	}
	if !timeoutGiven {
		c.timeout = cmd.timeout
	}
	if c.watch && cmd.timeout > 0 && c.timeout > 0 {
		// -watch runs until interrupted: the default bounds each refresh
		// (runStats), not the whole watch; a -timeout given bounds the
		// whole watch, and each refresh keeps the default, so that a
		// broker that stops answering is reported then, not only when a
		// long watch ends (-timeout 0: no limit on either).
		c.refreshTimeout = cmd.timeout
		if !timeoutGiven {
			c.timeout = 0
		}
	}
	parent := ctx
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	err = cmd.run(ctx, c, rest)
	if err != nil && c.timeout > 0 && parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// Say that it was -timeout that stopped it, and how to change it:
		// the broker's own error may only say "context deadline exceeded".
		how := "-timeout"
		if !timeoutGiven {
			how = fmt.Sprintf("-timeout, by default %s for %s; -timeout 0: no limit", c.timeout, cmd.name)
		}
		err = fmt.Errorf("gave up after %s (%s): %w", c.timeout, how, err)
	}
	return c.exit(cmd, err)
}

// find returns the command the leading positional arguments name and the
// arguments after it.
func find(pos []string) (*command, []string) {
	for _, cmd := range commands() {
		words := strings.Fields(cmd.name)
		if len(pos) >= len(words) && joinWords(pos[:len(words)]) == cmd.name {
			return cmd, pos[len(words):]
		}
	}
	return nil, nil
}

// exit prints err and returns the exit code it means.
func (c *cli) exit(cmd *command, err error) int {
	var (
		ue *usageError
		pe *partialError
	)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errDoctorFindings):
		return exitError
	case errors.As(err, &ue):
		fmt.Fprintf(c.stderr, "berth %s: %s\nrun \"berth %s -h\" for usage\n", cmd.name, errText(err), cmd.name)
		return exitUsage
	case errors.As(err, &pe):
		fmt.Fprintf(c.stderr, "berth %s: %s\n", cmd.name, errText(err))
		return exitPartial
	case errors.Is(err, errNothing) || errors.Is(err, sdk.ErrNotFound):
		fmt.Fprintf(c.stderr, "berth %s: %s\n", cmd.name, errText(err))
		return exitNotFound
	default:
		fmt.Fprintf(c.stderr, "berth %s: %s\n", cmd.name, errText(err))
		return exitError
	}
}

// interruptedBeforeChange returns err, the error that ended a change
// before it changed anything, as an interrupt when ctx is done (SIGINT,
// SIGTERM, -timeout): a *partialError (exit 4) saying "interrupted" and
// "nothing changed", as one at the y/N question is (confirm), rather than
// the bare "context canceled" of the read, connection or count it cut,
// which says neither. A *partialError is returned as it is: it says what
// it is already.
func interruptedBeforeChange(ctx context.Context, err error) error {
	var pe *partialError
	if err == nil || ctx.Err() == nil || errors.As(err, &pe) {
		return err
	}
	return &partialError{msg: fmt.Sprintf("interrupted (%v) before any change; nothing changed", ctx.Err()), err: err}
}

// errNothing is wrapped by the error of a command whose filters matched
// nothing; it exits 3.
var errNothing = errors.New("nothing matched")

// partialError is a change that was done only in part; it exits 4. err,
// when set, is the error that stopped it.
type partialError struct {
	msg string
	err error
}

func (e *partialError) Error() string { return e.msg }

// Unwrap returns the error that stopped the change, if any.
func (e *partialError) Unwrap() error { return e.err }

// clock returns the time now.
func (c *cli) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// broker opens the broker of -url, giving it 30 s to answer.
func (c *cli) broker(ctx context.Context) (sdk.Broker, error) {
	return c.brokerWithin(ctx, 30*time.Second)
}

// brokerWithin is broker giving the broker d to answer.
func (c *cli) brokerWithin(ctx context.Context, d time.Duration) (sdk.Broker, error) {
	if c.url == "" {
		return nil, usagef("no broker URL: give -url or set BERTH_URL")
	}
	octx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	b, err := c.open(octx, c.url)
	if err != nil {
		// A client that ran out of the deadline in its own read (amqp091's
		// handshake: an *amqp.Error whose reason says "i/o timeout") does
		// not say so in a form errors.Is knows: once the deadline has
		// passed, the error is marked as the deadline's.
		if dl, ok := octx.Deadline(); ok && !time.Now().Before(dl) && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
		}
		var pe *brokerurl.ParamError
		if errors.As(err, &pe) || errors.Is(err, brokerurl.ErrUnknownScheme) || errors.Is(err, brokerurl.ErrInvalidURL) {
			return nil, &usageError{err.Error()}
		}
		return nil, err
	}
	return b, nil
}

// mayChange returns the usage error of a change that could never be
// confirmed: no -yes, no -dry-run and no terminal to ask on. A change
// checks it before it reads anything, so that a refused command has not
// first scanned the whole dead-letter queue (on RabbitMQ and SQS, by taking
// every letter and putting it back) or outbox table to count what it will
// not change.
func (c *cli) mayChange() error {
	if c.yes || c.dryRun || c.interactive {
		return nil
	}
	return usagef("refusing to change anything without -yes (no terminal to ask on); -dry-run shows what would change")
}

// confirm asks the operator on a terminal; elsewhere it refuses without -yes.
// An interrupt (ctx done: SIGINT, SIGTERM, -timeout) while it waits for the
// answer is a *partialError (exit 4, "interrupted"): nothing was changed.
//
// The read of the answer runs in a goroutine that confirm does not wait
// for once ctx is done: a read of a terminal cannot be cut short (os.Stdin
// has no deadlines), so it stays blocked until a line or EOF comes. Its
// owner is the process: the command returns at once, and main exits
// right after run returns, ending it; nothing else reads stdin. It holds
// only stdin and a channel with room for its one answer, so it never
// blocks on sending.
func (c *cli) confirm(ctx context.Context, question string) error {
	if c.yes {
		return nil
	}
	if !c.interactive {
		return c.mayChange()
	}
	fmt.Fprintf(c.stderr, "%s [y/N] ", question)
	answer := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(c.stdin).ReadString('\n')
		answer <- line
	}()
	var line string
	select {
	case line = <-answer:
	case <-ctx.Done():
	}
	if ctx.Err() != nil {
		fmt.Fprintln(c.stderr) // end the prompt's line (after the terminal's ^C)
		return &partialError{msg: fmt.Sprintf("interrupted (%v) at the confirmation; nothing changed", ctx.Err()), err: ctx.Err()}
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return errors.New("not confirmed; nothing changed")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
