package monitoring

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/telemetry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	dashboardFile = "grafana/berth.json"
	rulesFile     = "prometheus/berth-alerts.yml"
	rulesTestFile = "prometheus/berth-alerts.test.yml"
	runbookFile   = "../../RUNBOOK.md"
)

// instrument is one instrument berth creates.
type instrument struct {
	name, unit string
	kind       sdkmetric.InstrumentKind
}

// exported returns every instrument packages telemetry and ledger create,
// seen through a View of the OpenTelemetry SDK (called once per instrument
// as it is made), so the list cannot drift from the code.
func exported(t *testing.T) []instrument {
	t.Helper()
	var (
		mu   sync.Mutex
		seen = map[string]instrument{}
	)
	record := func(i sdkmetric.Instrument) (sdkmetric.Stream, bool) {
		mu.Lock()
		seen[i.Name] = instrument{name: i.Name, unit: i.Unit, kind: i.Kind}
		mu.Unlock()
		return sdkmetric.Stream{}, false
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()), sdkmetric.WithView(record))
	defer mp.Shutdown(context.Background())
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	tel, err := telemetry.New(telemetry.Options{MeterProvider: mp, Queues: []telemetry.InspectedQueue{{Inspector: b, Queue: "q"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Close()
	led, err := ledger.New(ledger.Options{Store: discard{}, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	if err := led.Close(); err != nil {
		t.Fatal(err)
	}
	var out []instrument
	for _, i := range seen {
		out = append(out, i)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
	if len(out) < 20 {
		t.Fatalf("only %d instruments seen: %v", len(out), out)
	}
	return out
}

// discard is a ledger Store that keeps nothing: this test only needs the
// ledger's instruments.
type discard struct{}

func (discard) Write(context.Context, []ledger.Event) error { return nil }

var invalidChars = regexp.MustCompile(`[^a-zA-Z0-9_:]`)

// unitSuffixes maps the UCUM units berth uses to the suffix the exporter
// adds; annotations in braces ({message}) add none.
var unitSuffixes = map[string]string{"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio"}

// promSeries returns the Prometheus series names of i, as the OpenTelemetry
// Prometheus exporter writes them (OpenTelemetry specification,
// "Prometheus and OpenMetrics Compatibility": invalid characters become
// "_", the unit's suffix is added, counters end in _total, histograms are
// _bucket, _sum and _count).
func promSeries(i instrument) []string {
	name := invalidChars.ReplaceAllString(i.name, "_")
	if suf, ok := unitSuffixes[i.unit]; ok && !strings.HasSuffix(name, "_"+suf) {
		name += "_" + suf
	}
	switch i.kind {
	case sdkmetric.InstrumentKindCounter, sdkmetric.InstrumentKindObservableCounter:
		return []string{name + "_total"}
	case sdkmetric.InstrumentKindHistogram:
		return []string{name + "_bucket", name + "_sum", name + "_count"}
	default: // gauges and up-down counters
		return []string{name}
	}
}

// isCounterSeries reports whether a series only ever grows (so only its
// rate or increase means anything).
func isCounterSeries(i instrument) bool {
	switch i.kind {
	case sdkmetric.InstrumentKindCounter, sdkmetric.InstrumentKindObservableCounter, sdkmetric.InstrumentKindHistogram:
		return true
	}
	return false
}

// knownLabels are the label names berth's series carry: the attribute keys
// packages telemetry and ledger record, made Prometheus names, and those
// Prometheus and the exporter add.
func knownLabels() map[string]bool {
	keys := []attribute.Key{
		semconv.MessagingSystemKey, semconv.MessagingDestinationNameKey, semconv.ErrorTypeKey,
		telemetry.AttrJobType, telemetry.AttrAction, telemetry.AttrQueueState, telemetry.AttrResource,
		telemetry.AttrLockAcquired, telemetry.AttrLeaseResult, telemetry.AttrIdempotencyEvent,
		telemetry.AttrSettleErrorType, ledger.AttrResult,
	}
	m := map[string]bool{"le": true, "job": true, "instance": true, "otel_scope_name": true, "otel_scope_version": true}
	for _, k := range keys {
		m[invalidChars.ReplaceAllString(string(k), "_")] = true
	}
	return m
}

// catalogue indexes the exported series.
type catalogue struct {
	series map[string]instrument // series name -> its instrument
	labels map[string]bool
}

func newCatalogue(t *testing.T) catalogue {
	c := catalogue{series: map[string]instrument{}, labels: knownLabels()}
	for _, i := range exported(t) {
		for _, s := range promSeries(i) {
			c.series[s] = i
		}
	}
	return c
}

// newSeries matches the idiom "x unless x offset d": the series that are new
// in the window, the only raw use of a counter that means something (its
// first event, which increase() cannot see).
var newSeries = regexp.MustCompile(`\bunless\s+[a-z_]+(\{[^}]*\})?\s+offset\s+[0-9]+[smhdw]`)

// check reports what is wrong with expr: unknown metrics, labels or
// functions, the rate of a gauge, a raw counter.
func (c catalogue) check(expr string) []string {
	p, err := scanPromQL(expr)
	if err != nil {
		return []string{err.Error()}
	}
	var errs []string
	if len(p.uses) == 0 {
		errs = append(errs, "names no berth metric")
	}
	for _, u := range p.uses {
		i, ok := c.series[u.metric]
		switch {
		case !ok:
			errs = append(errs, fmt.Sprintf("metric %s is not one berth exports", u.metric))
		case isCounterSeries(i) && !map[string]bool{"rate": true, "irate": true, "increase": true, "resets": true}[u.fn] && !newSeries.MatchString(expr):
			errs = append(errs, fmt.Sprintf("counter %s used without rate or increase (inside %q)", u.metric, u.fn))
		case !isCounterSeries(i) && map[string]bool{"rate": true, "irate": true, "increase": true}[u.fn]:
			errs = append(errs, fmt.Sprintf("%s of gauge %s", u.fn, u.metric))
		}
	}
	for _, l := range p.labels {
		if !c.labels[l] {
			errs = append(errs, fmt.Sprintf("label %s is not one berth's series carry", l))
		}
	}
	for _, f := range p.funcs {
		if !aggregations[strings.ToLower(f)] && !functions[f] {
			errs = append(errs, fmt.Sprintf("unknown function %s", f))
		}
	}
	return errs
}

// TestPromSeriesNames pins the translation on a few instruments whose
// Prometheus names operators will type.
func TestPromSeriesNames(t *testing.T) {
	c := newCatalogue(t)
	for _, want := range []string{
		"berth_queue_depth", "berth_queue_oldest_age_seconds", "berth_worker_in_flight",
		"messaging_client_consumed_messages_total", "berth_delivery_redeliveries_total",
		"berth_job_retries_total", "berth_job_dead_letters_total", "berth_idempotency_duplicates_total",
		"berth_idempotency_conflicts_total", "berth_concurrency_lock_wait_duration_seconds_bucket",
		"messaging_process_duration_seconds_bucket", "berth_ledger_lag_seconds_count",
	} {
		if _, ok := c.series[want]; !ok {
			t.Errorf("berth exports no series %s", want)
		}
	}
}

// dashboard is the part of a Grafana dashboard model the test reads.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// flatten returns the dashboard's panels, rows' panels included.
func flatten(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flatten(p.Panels)...)
	}
	return out
}

var labelValues = regexp.MustCompile(`^label_values\(\s*(.+?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// TestDashboardUsesExportedMetrics parses the Grafana dashboard and checks
// every query against berth's exports, and that every berth instrument has
// a panel.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	c := newCatalogue(t)
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard needs a uid and a title")
	}
	used := map[string]bool{}
	ids := map[int]bool{}
	for _, p := range flatten(d.Panels) {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Title == "" || p.GridPos == nil {
			t.Errorf("panel %d: needs a title and a gridPos", p.ID)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource must be the ${datasource} variable", p.Title)
		}
		for _, tg := range p.Targets {
			for _, e := range c.check(tg.Expr) {
				t.Errorf("panel %q, query %s: %s", p.Title, tg.RefID, e)
			}
			sc, _ := scanPromQL(tg.Expr)
			for _, u := range sc.uses {
				used[c.series[u.metric].name] = true
			}
		}
	}
	vars := 0
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		vars++
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var obj struct{ Query string }
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				t.Errorf("variable %s: query: %v", v.Name, err)
				continue
			}
			q = obj.Query
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, q)
			continue
		}
		for _, e := range c.check(m[1]) {
			if !strings.Contains(e, "without rate") { // a selector of label names: any series will do
				t.Errorf("variable %s: %s", v.Name, e)
			}
		}
		if !c.labels[m[2]] {
			t.Errorf("variable %s: label %s is not one berth's series carry", v.Name, m[2])
		}
	}
	if vars == 0 {
		t.Error("dashboard has no query variables (queue, job type)")
	}
	for _, i := range exported(t) {
		if !used[i.name] {
			t.Errorf("instrument %s (%s) has no panel", i.name, promSeries(i)[0])
		}
	}
}

// ruleFile is a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// loadRules parses the alert rules, refusing unknown fields.
func loadRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return rf
}

// runbookAnchors returns the GitHub anchors of RUNBOOK.md's headings.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var a strings.Builder
		for _, r := range h {
			switch {
			case r == ' ' || r == '-':
				a.WriteRune('-')
			case r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
				a.WriteRune(r)
			}
		}
		anchors[a.String()] = true
	}
	return anchors
}

// TestAlertRulesUseExportedMetrics parses the alert rules and checks each
// rule's query against berth's exports, its severity, its annotations, and
// that its runbook annotation names a section of RUNBOOK.md.
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	c := newCatalogue(t)
	rf := loadRules(t)
	anchors := runbookAnchors(t)
	alerts := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule without alert name (recording rules do not belong here)", g.Name)
				continue
			}
			if alerts[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			alerts[r.Alert] = true
			for _, e := range c.check(r.Expr) {
				t.Errorf("alert %s: %s", r.Alert, e)
			}
			switch r.Labels["severity"] {
			case "critical", "warning", "info":
			default:
				t.Errorf("alert %s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: needs summary and description annotations", r.Alert)
			}
			rb := r.Annotations["runbook"]
			file, anchor, ok := strings.Cut(rb, "#")
			if !ok || file != "RUNBOOK.md" || !anchors[anchor] {
				t.Errorf("alert %s: runbook %q is not RUNBOOK.md#<a heading of RUNBOOK.md>", r.Alert, rb)
			}
		}
	}
	if len(alerts) < 8 {
		t.Errorf("only %d alerts", len(alerts))
	}

	// The unit tests' input series must be berth's too.
	tb, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			InputSeries []struct {
				Series string `yaml:"series"`
			} `yaml:"input_series"`
			AlertRuleTests []struct {
				Alertname string `yaml:"alertname"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(tb, &tests); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	tested := map[string]bool{}
	for _, ts := range tests.Tests {
		for _, s := range ts.InputSeries {
			p, err := scanPromQL(s.Series)
			if err != nil || len(p.uses) != 1 {
				t.Errorf("input series %q: %v", s.Series, err)
				continue
			}
			if _, ok := c.series[p.uses[0].metric]; !ok {
				t.Errorf("input series %s is not one berth exports", p.uses[0].metric)
			}
			for _, l := range p.labels {
				if !c.labels[l] {
					t.Errorf("input series %q: label %s is not one berth's series carry", s.Series, l)
				}
			}
		}
		for _, a := range ts.AlertRuleTests {
			tested[a.Alertname] = true
		}
	}
	for a := range alerts {
		if !tested[a] {
			t.Errorf("alert %s has no promtool unit test in %s", a, rulesTestFile)
		}
	}
}

// grafanaVars replaces the dashboard's variables with values Prometheus
// accepts.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "${queue}", ".*", "$queue", ".*",
	"${job_type}", ".*", "$job_type", ".*")

// TestPromtool has Prometheus's own tool check the alert rules' syntax, run
// their unit tests, and check every dashboard query's syntax (as recording
// rules of a scratch file). promtool comes with Debian's prometheus
// package, which scripts/services installs; without it the test is skipped,
// except under CI, where it fails.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not on PATH under CI: scripts/services installs it (apt-get install prometheus)")
		}
		t.Skip("promtool not on PATH (apt-get install prometheus); the Go checks above still ran")
	}
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("check", "rules", rulesFile)
	run("test", "rules", rulesTestFile)

	d := loadDashboard(t)
	var rules strings.Builder
	rules.WriteString("groups:\n- name: dashboard\n  rules:\n")
	n := 0
	for _, p := range flatten(d.Panels) {
		for _, tg := range p.Targets {
			n++
			expr, _ := json.Marshal(grafanaVars.Replace(tg.Expr)) // a JSON string is a YAML string
			fmt.Fprintf(&rules, "  - record: dashboard:query_%d\n    expr: %s\n", n, expr)
		}
	}
	scratch := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(scratch, []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	run("check", "rules", scratch)
}
