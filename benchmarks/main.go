// Command berthbench measures berth against the raw clients (amqp091-go,
// pgx, aws-sdk-go-v2, nats.go) and against its peers (Watermill's GoChannel
// and AMQP, River) side by side in one process, in alternating rounds, as
// well as what telemetry costs per message, and regenerates the generated
// part of BENCHMARKS.md and the scaling plots under docs/bench/.
//
// It is a module of its own so that the library's go.mod does not carry the
// peers' dependencies. From the repository root:
//
//	scripts/bench            # everything, rewrites BENCHMARKS.md and docs/bench/*.png
//	scripts/bench -only sqs  # the SQS section only; the others are kept
//	cd benchmarks && go run . -quick -only memory   # one scenario, small, to stdout
//
// Each scenario has its own section in BENCHMARKS.md's generated block,
// saying when, on which machine and by which command it was measured (see
// merge). A scenario that fails keeps its last good section and makes the
// command exit with status 1; an -only that matches no scenario, or a block
// without sections under -only, is refused before anything is measured.
//
// It needs the services of scripts/services (RabbitMQ, PostgreSQL, NATS, the
// fauxqs SQS emulator) on loopback, at the same addresses as the tests
// (BERTH_RABBITMQ_URL, BERTH_SQS_ENDPOINT and the others override them).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"time"
)

// config is what every scenario reads.
type config struct {
	quick  bool
	rounds int // alternating rounds per comparison
	scale  int // messages per round multiplier
}

// table is one generated Markdown table with its heading and explanation.
type table struct {
	title string
	intro string // how every variant is configured
	head  []string
	rows  [][]string
}

func (t table) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s\n\n%s\n\n", t.title, strings.TrimSpace(t.intro))
	b.WriteString("| " + strings.Join(t.head, " | ") + " |\n|")
	for i := range t.head {
		if i == 0 || t.head[i] == "configuration" {
			b.WriteString("---|")
		} else {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	for _, r := range t.rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	return b.String()
}

type scenario struct {
	name string
	run  func(ctx context.Context, c config) ([]table, error)
}

var scenarios = []scenario{
	{"memory", runMemory},
	{"rabbitmq-publish", runRabbitPublish},
	{"rabbitmq-consume", runRabbitConsume},
	{"postgres", runPostgres},
	{"sqs", runSQS},
	{"jetstream", runJetStream},
	{"telemetry", runTelemetry},
	{"scaling", runScaling},
}

func main() {
	quick := flag.Bool("quick", false, "small rounds (a smoke run: figures are noisy)")
	only := flag.String("only", "", "run only the scenarios matching this regexp")
	write := flag.String("write", "", "the BENCHMARKS.md to rewrite between the berthbench markers (plots go to docs/bench beside it)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	variants := flag.String("variants", "", "in every table, measure only the reference row and the variants matching this regexp (for profiling one path; refused with -write)")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	c := config{quick: *quick, rounds: 6, scale: 1}
	if c.quick {
		c.rounds, c.scale = 2, 0
	}
	re, err := regexp.Compile(*only)
	if err != nil {
		fatal(err)
	}
	if *variants != "" {
		if *write != "" {
			fatal(errors.New("-variants measures part of each table: it does not go with -write"))
		}
		if variantFilter, err = regexp.Compile(*variants); err != nil {
			fatal(err)
		}
	}

	var order []string
	selected := 0
	for _, sc := range scenarios {
		order = append(order, sc.name)
		if re.MatchString(sc.name) {
			selected++
		}
	}
	if selected == 0 {
		// Nothing to measure: with -write, rewriting would only drop tables.
		fatal(fmt.Errorf("-only %q matches no scenario (%s)", *only, strings.Join(order, ", ")))
	}
	if *write != "" {
		// Checked before measuring: the file and its block must
		// take what this run will write.
		old, err := os.ReadFile(*write)
		if err != nil {
			fatal(err)
		}
		if _, err := rewriteBlock(string(old), run{partial: selected < len(scenarios)}, order); err != nil {
			fatal(fmt.Errorf("%s: %w", *write, err))
		}
		plotDir = filepath.Join(filepath.Dir(*write), "docs", "bench")
		if err := os.MkdirAll(plotDir, 0o755); err != nil {
			fatal(err)
		}
	}
	if *cpuProfile != "" { // after the checks: a refused run leaves no profile behind
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	cmd := "scripts/bench" // which passes -write
	if *write == "" {
		cmd = "cd benchmarks && go run ."
	}
	if c.quick {
		cmd += " -quick"
	}
	if *only != "" {
		cmd += " -only " + shellQuote(*only)
	}
	if *cpuProfile != "" {
		// Profiling costs CPU time: say so beside the figures.
		cmd += " -cpuprofile " + shellQuote(*cpuProfile)
	}
	ctx := context.Background()
	r := run{
		preamble: "\n\nRates are messages per second over all rounds; variants of one table run in alternating rounds in one process, so load from elsewhere falls on each alike; × is the ratio to the table's reference row. Each scenario's section says when, on which machine and by which command it was last measured: `scripts/bench -only REGEXP` measures the scenarios whose names match and keeps the other sections as they were, and a scenario that fails keeps its last good section.\n\n",
		failed:   map[string]error{},
		partial:  selected < len(scenarios),
	}
	for _, sc := range scenarios {
		if !re.MatchString(sc.name) {
			continue
		}
		fmt.Fprintf(os.Stderr, "berthbench: %s...\n", sc.name)
		start := time.Now()
		tables, err := sc.run(ctx, c)
		if err != nil {
			fmt.Fprintf(os.Stderr, "berthbench: %s: %v\n", sc.name, err)
			r.failed[sc.name] = err
			continue
		}
		var out strings.Builder
		fmt.Fprintf(&out, "\nMeasured %s on %s (%s/%s, %d CPUs, %s, load average %s) by `%s`",
			start.UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), loadAvg(), cmd)
		if c.quick {
			out.WriteString(" in -quick mode (small rounds: noisy)")
		}
		out.WriteString(".\n\n")
		for _, t := range tables {
			out.WriteString(t.markdown())
			out.WriteString("\n")
		}
		r.fresh = append(r.fresh, section{name: sc.name, text: out.String()})
		fmt.Fprintf(os.Stderr, "berthbench: %s done in %s\n", sc.name, time.Since(start).Round(time.Second))
	}
	if *write == "" {
		merged, _ := merge("", run{preamble: r.preamble, fresh: r.fresh, failed: r.failed}, order)
		fmt.Print(merged)
	} else if err := rewrite(*write, r, order); err != nil {
		fatal(err)
	}
	if len(r.failed) > 0 {
		var names []string
		for _, name := range order {
			if _, ok := r.failed[name]; ok {
				names = append(names, name)
			}
		}
		fatal(fmt.Errorf("not measured: %s (their sections, if any, are those of their last good run)", strings.Join(names, ", ")))
	}
}

// rewrite rewrites the generated block of the file at path (see merge).
func rewrite(path string, r run, order []string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc, err := rewriteBlock(string(old), r, order)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}

// fatal reports err and exits with status 1. It stops a CPU profile first
// (os.Exit skips main's deferred stop), so that a run failing after minutes of
// measuring, or while writing BENCHMARKS.md, keeps its profile.
func fatal(err error) {
	pprof.StopCPUProfile() // a no-op when not profiling
	fmt.Fprintln(os.Stderr, "berthbench:", err)
	os.Exit(1)
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "model name") {
			if _, v, ok := strings.Cut(line, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return "unknown CPU"
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return "?"
	}
	return f[0]
}

// variant is one contender of a comparison: round processes n messages and
// returns how long it took.
type variant struct {
	name   string
	config string
	round  func(ctx context.Context, n int) (time.Duration, error)
}

// result is a variant's rate over all its rounds.
type result struct {
	name, config string
	msgs         int
	elapsed      time.Duration
	rates        []float64 // per round
}

func (r result) rate() float64 { return float64(r.msgs) / r.elapsed.Seconds() }

// traceRounds (BERTH_BENCH_ROUNDS set) writes every timed round to stderr.
var traceRounds = os.Getenv("BERTH_BENCH_ROUNDS") != ""

// variantFilter (-variants), when set, picks the variants alternate
// measures besides the reference (the first).
var variantFilter *regexp.Regexp

// alternate runs rounds of n messages through each variant in turn, the
// order rotating each round, and returns their rates.
func alternate(ctx context.Context, vs []variant, rounds, n int) ([]result, error) {
	if variantFilter != nil && len(vs) > 0 {
		picked := vs[:1:1]
		for _, v := range vs[1:] {
			if variantFilter.MatchString(v.name) {
				picked = append(picked, v)
			}
		}
		vs = picked
	}
	res := make([]result, len(vs))
	for i, v := range vs {
		res[i] = result{name: v.name, config: v.config}
	}
	// A warm-up round each (connections, declarations, JIT of the caches).
	for _, v := range vs {
		if _, err := v.round(ctx, max(n/10, 1)); err != nil {
			return nil, fmt.Errorf("%s: warm-up: %w", v.name, err)
		}
	}
	for r := range rounds {
		for k := range vs {
			i := (k + r) % len(vs)
			d, err := vs[i].round(ctx, n)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", vs[i].name, err)
			}
			res[i].msgs += n
			res[i].elapsed += d
			res[i].rates = append(res[i].rates, float64(n)/d.Seconds())
			if traceRounds {
				fmt.Fprintf(os.Stderr, "round %d %s: %v\n", r, vs[i].name, d.Round(time.Millisecond))
			}
		}
	}
	return res, nil
}

// rows renders results against the reference (index ref).
func rows(res []result, ref int) [][]string {
	var out [][]string
	for _, r := range res {
		sorted := append([]float64(nil), r.rates...)
		sort.Float64s(sorted)
		spread := ""
		if len(sorted) > 0 {
			spread = fmt.Sprintf("%s–%s", rateStr(sorted[0]), rateStr(sorted[len(sorted)-1]))
		}
		out = append(out, []string{r.name, rateStr(r.rate()), spread, "**" + ratioStr(r.rate()/res[ref].rate()) + "**", r.config})
	}
	return out
}

var resultHead = []string{"variant", "msgs/s", "rounds (min–max)", "×", "configuration"}

func rateStr(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2f M", r/1e6)
	case r >= 1e4:
		return fmt.Sprintf("%.1f k", r/1e3)
	default:
		return fmt.Sprintf("%.0f", r)
	}
}

func msgs(c config, full int) int {
	if c.quick {
		return max(full/10, 50)
	}
	return full
}

// ratioStr keeps two significant digits for small ratios (0.015, not 0.02).
func ratioStr(x float64) string {
	if x < 0.1 {
		return fmt.Sprintf("%.3f", x)
	}
	return fmt.Sprintf("%.2f", x)
}
