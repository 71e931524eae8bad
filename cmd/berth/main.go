// Command berth is the operator's tool for berth queues: queue statistics and
// the dead-letter queue (list, show, redrive, purge) on RabbitMQ, SQS and
// PostgreSQL.
//
// Usage:
//
//	berth -broker postgres -url postgres://localhost/app stats billing
//	berth -broker rabbitmq -url amqp://guest:guest@localhost/ dlq list billing
//	berth -broker sqs -url http://127.0.0.1:4566 dlq show billing 0192f1d4-...
//	berth -broker postgres dlq redrive billing            # all dead letters
//	berth -broker postgres dlq redrive billing ID1 ID2    # some
//	berth -broker postgres dlq purge billing
//
// The URL may also come from the BERTH_URL environment variable, which keeps
// credentials out of shell history. It never appears in output or errors.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/berthq/berth/sdk"
)

// opener connects to a broker.
type opener func(ctx context.Context, t target) (sdk.Broker, error)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, open)
	stop()
	os.Exit(code)
}

const usage = `usage: berth [flags] <command>

commands:
  stats QUEUE...              depth, delayed, in flight, dead-lettered, oldest age
  dlq list QUEUE [-n N]       dead letters with their reasons
  dlq show QUEUE ID           one dead letter, headers and body
  dlq redrive QUEUE [ID...]   put dead letters back on QUEUE (all when no ID), attempts reset
  dlq purge QUEUE             delete every dead letter of QUEUE

flags:
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer, open opener) int {
	fs := flag.NewFlagSet("berth", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kind := fs.String("broker", os.Getenv("BERTH_BROKER"), "broker: rabbitmq, sqs or postgres (env BERTH_BROKER)")
	url := fs.String("url", "", "broker URL, DSN or SQS endpoint (default: env BERTH_URL)")
	schema := fs.String("schema", "", "PostgreSQL broker schema (default: the broker's)")
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *url == "" {
		*url = os.Getenv("BERTH_URL")
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	b, err := open(ctx, target{kind: *kind, url: *url, schema: *schema})
	if err != nil {
		fmt.Fprintf(stderr, "berth: %v\n", err)
		return 1
	}
	defer b.Close()

	out := output{w: stdout, json: *asJSON}
	err = dispatch(ctx, b, rest, out)
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "berth: %v\n\n", err)
		fs.Usage()
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "berth: %v\n", err)
		return 1
	}
	return 0
}

type usageError string

func (e usageError) Error() string { return string(e) }

func dispatch(ctx context.Context, b sdk.Broker, args []string, out output) error {
	switch args[0] {
	case "stats":
		if len(args) < 2 {
			return usageError("stats needs at least one QUEUE")
		}
		in, ok := b.(sdk.Inspector)
		if !ok {
			return fmt.Errorf("this broker cannot report statistics")
		}
		var all []sdk.QueueStats
		for _, q := range args[1:] {
			st, err := in.Stats(ctx, q)
			if err != nil {
				return fmt.Errorf("stats %s: %w", q, err)
			}
			all = append(all, st)
		}
		return out.stats(all)
	case "dlq":
		if len(args) < 3 {
			return usageError("dlq needs a subcommand and a QUEUE")
		}
		dl, ok := b.(sdk.DeadLetters)
		if !ok {
			return fmt.Errorf("this broker has no dead-letter operations")
		}
		return dlq(ctx, dl, args[1], args[2], args[3:], out)
	default:
		return usageError(fmt.Sprintf("unknown command %q", args[0]))
	}
}

func dlq(ctx context.Context, dl sdk.DeadLetters, sub, queue string, rest []string, out output) error {
	switch sub {
	case "list":
		fs := flag.NewFlagSet("dlq list", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		n := fs.Int("n", 50, "at most this many")
		if err := fs.Parse(rest); err != nil || fs.NArg() > 0 {
			return usageError("dlq list QUEUE [-n N]")
		}
		msgs, err := dl.ListDeadLetters(ctx, queue, *n)
		if err != nil {
			return err
		}
		return out.deadLetters(msgs)
	case "show":
		if len(rest) != 1 {
			return usageError("dlq show QUEUE ID")
		}
		m, err := dl.GetDeadLetter(ctx, queue, rest[0])
		if err != nil {
			return err
		}
		return out.message(m)
	case "redrive":
		n, err := dl.RedriveDeadLetters(ctx, queue, rest...)
		if err != nil {
			return err
		}
		return out.count("redriven", n)
	case "purge":
		if len(rest) != 0 {
			return usageError("dlq purge QUEUE")
		}
		n, err := dl.PurgeDeadLetters(ctx, queue)
		if err != nil {
			return err
		}
		return out.count("purged", n)
	default:
		return usageError(fmt.Sprintf("unknown dlq subcommand %q", sub))
	}
}

type output struct {
	w    io.Writer
	json bool
}

func (o output) encode(v any) error {
	enc := json.NewEncoder(o.w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (o output) stats(all []sdk.QueueStats) error {
	if o.json {
		type js struct {
			Queue        string  `json:"queue"`
			Ready        int64   `json:"ready"`
			Delayed      int64   `json:"delayed"`
			InFlight     int64   `json:"in_flight"`
			DeadLettered int64   `json:"dead_lettered"`
			OldestAgeSec float64 `json:"oldest_age_seconds"`
		}
		var v []js
		for _, s := range all {
			v = append(v, js{s.Queue, s.Ready, s.Delayed, s.InFlight, s.DeadLettered, s.OldestAge.Seconds()})
		}
		return o.encode(v)
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tREADY\tDELAYED\tIN FLIGHT\tDEAD\tOLDEST")
	for _, s := range all {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", s.Queue, s.Ready, s.Delayed, s.InFlight, s.DeadLettered, s.OldestAge.Round(time.Millisecond))
	}
	return tw.Flush()
}

func (o output) deadLetters(msgs []*sdk.Message) error {
	if o.json {
		v := make([]jsonMessage, len(msgs))
		for i, m := range msgs {
			v[i] = toJSON(m)
		}
		return o.encode(v)
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTYPE\tATTEMPTS\tCLASS\tLAST FAILURE\tREASON")
	for _, m := range msgs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.Type, m.Header(sdk.HeaderDeadLetterAttempts),
			m.Header(sdk.HeaderDeadLetterClass), m.Header(sdk.HeaderLastFailure), oneLine(m.Header(sdk.HeaderDeadLetterReason), 80))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(o.w, "%d dead letter(s)\n", len(msgs))
	return err
}

type jsonMessage struct {
	ID             string            `json:"id"`
	Type           string            `json:"type"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Key            string            `json:"key,omitempty"`
	CorrelationID  string            `json:"correlation_id,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
	Body           string            `json:"body"` // text, or base64 of binary bodies prefixed "base64:"
}

func toJSON(m *sdk.Message) jsonMessage {
	return jsonMessage{m.ID, m.Type, m.IdempotencyKey, m.Key, m.CorrelationID, m.Headers, bodyText(m.Body)}
}

func (o output) message(m *sdk.Message) error {
	if o.json {
		return o.encode(toJSON(m))
	}
	fmt.Fprintf(o.w, "id:              %s\ntype:            %s\nidempotency key: %s\nkey:             %s\ncorrelation id:  %s\n",
		m.ID, m.Type, m.IdempotencyKey, m.Key, m.CorrelationID)
	names := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	fmt.Fprintln(o.w, "headers:")
	for _, k := range names {
		fmt.Fprintf(o.w, "  %s: %s\n", k, m.Headers[k])
	}
	_, err := fmt.Fprintf(o.w, "body (%d bytes):\n%s\n", len(m.Body), bodyText(m.Body))
	return err
}

func (o output) count(what string, n int) error {
	if o.json {
		return o.encode(map[string]int{what: n})
	}
	_, err := fmt.Fprintf(o.w, "%s %d message(s)\n", what, n)
	return err
}

func bodyText(b []byte) string {
	if isText(b) {
		return string(b)
	}
	return "base64:" + base64.StdEncoding.EncodeToString(b)
}

func isText(b []byte) bool {
	s := string(b)
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 && r != '\n' && r != '\r' && r != '\t' {
			return false
		}
	}
	return true
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
