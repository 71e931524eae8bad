package monitoring

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/berthq/berth/internal/markdown"
)

// codeSpans is markdown.CodeSpans, short.
var codeSpans = markdown.CodeSpans

var (
	grafanaRef = regexp.MustCompile(`\[Grafana: ([^/\]]+?) / ([^\]]+?)\]`)
	alertName  = regexp.MustCompile(`^Berth[A-Z][A-Za-z]+$`)
	anchorLink = regexp.MustCompile(`\]\(#([a-z0-9-]+)\)`)
	promName   = regexp.MustCompile(`^(berth|messaging)_[a-z0-9_]+`)
)

// TestRunbookReferencesExist checks that what RUNBOOK.md tells operators to
// look at exists: every metric and label it names is one berth exports,
// every [Grafana: Row / Panel] is a panel of that row of the dashboard,
// every alert it names is a rule (and every rule is named), and every link
// to a section has its heading. (Its CLI commands are checked by
// cmd/berth's tests.)
func TestRunbookReferencesExist(t *testing.T) {
	c := newCatalogue(t)
	b, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)

	metrics := 0
	for _, span := range codeSpans(md) {
		if !promName.MatchString(span) {
			continue
		}
		if prefix, ok := strings.CutSuffix(span, "*"); ok { // a family: berth_queue_*
			found := false
			for name := range c.series {
				found = found || strings.HasPrefix(name, prefix)
			}
			if !found {
				t.Errorf("RUNBOOK.md `%s`: no series berth exports starts so", span)
			}
			continue
		}
		p, err := scanPromQL(span)
		if err != nil {
			t.Errorf("RUNBOOK.md `%s`: %v", span, err)
			continue
		}
		for _, u := range p.uses {
			metrics++
			_, series := c.series[u.metric]
			_, histogram := c.series[u.metric+"_bucket"] // a histogram named by its family
			if !series && !histogram && !c.labels[u.metric] {
				t.Errorf("RUNBOOK.md `%s`: %s is neither a series, a histogram nor a label berth exports", span, u.metric)
			}
		}
		for _, l := range p.labels {
			if !c.labels[l] {
				t.Errorf("RUNBOOK.md `%s`: label %s is not one berth's series carry", span, l)
			}
		}
	}
	if metrics < 20 {
		t.Errorf("RUNBOOK.md names only %d metrics", metrics)
	}

	d := loadDashboard(t)
	rows := map[string]map[string]bool{}
	row := ""
	for _, p := range d.Panels {
		if p.Type == "row" {
			row = p.Title
			rows[row] = map[string]bool{}
			for _, q := range p.Panels {
				rows[row][q.Title] = true
			}
			continue
		}
		if rows[row] == nil {
			rows[row] = map[string]bool{}
		}
		rows[row][p.Title] = true
	}
	refs := grafanaRef.FindAllStringSubmatch(md, -1)
	if len(refs) < 10 {
		t.Errorf("RUNBOOK.md points at only %d dashboard panels", len(refs))
	}
	for _, m := range refs {
		if m[1] == "Row" && m[2] == "Panel" { // the notation, explained
			continue
		}
		if !rows[m[1]][m[2]] {
			t.Errorf("RUNBOOK.md %s: no panel %q in row %q of %s", m[0], m[2], m[1], dashboardFile)
		}
	}

	rules := map[string]bool{}
	rf := loadRules(t)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = true
		}
	}
	named := map[string]bool{}
	for _, span := range codeSpans(md) {
		if alertName.MatchString(span) {
			named[span] = true
			if !rules[span] {
				t.Errorf("RUNBOOK.md names alert %s, which %s does not define", span, rulesFile)
			}
		}
	}
	for a := range rules {
		if !named[a] {
			t.Errorf("alert %s is not named in RUNBOOK.md", a)
		}
	}

	anchors := runbookAnchors(t)
	for _, m := range anchorLink.FindAllStringSubmatch(md, -1) {
		if !anchors[m[1]] {
			t.Errorf("RUNBOOK.md links to #%s, which is no heading of it", m[1])
		}
	}
	for _, want := range []string{"an-order-was-charged-twice", "jobs-are-stuck", "the-dlq-grows",
		"a-balance-is-wrong-lost-update", "lock-contention", "duplicates-after-a-deploy"} {
		if !anchors[want] {
			t.Errorf("RUNBOOK.md lacks the checklist #%s", want)
		}
	}
}

// checkID is what a configuration or doctor check's stable ID looks like:
// an area and a name (worker.max-attempts-over-broker-cap, clock.skew).
var checkID = regexp.MustCompile(`^(worker|broker|rabbitmq|sqs|postgres|jetstream|idempotency|clock|doctor)\.[a-z0-9]+(-[a-z0-9]+)*$`)

// TestRunbookCheckIDsExist checks that every check ID RUNBOOK.md names is a
// string literal of berth's code (sdk's Conflict* constants, package
// doctor's checks), so that a renamed check cannot leave the runbook
// pointing at nothing.
func TestRunbookCheckIDsExist(t *testing.T) {
	b, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, span := range codeSpans(string(b)) {
		if checkID.MatchString(span) {
			ids[span] = false
		}
	}
	if len(ids) < 15 {
		t.Fatalf("RUNBOOK.md names only %d check IDs", len(ids))
	}
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "../.." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for id := range ids {
			if strings.Contains(string(src), `"`+id+`"`) {
				ids[id] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for id, found := range ids {
		if !found {
			t.Errorf("RUNBOOK.md names check %s, which no Go file of the repository defines", id)
		}
	}
}

// findingID finds the IDs package doctor gives its findings.
var findingID = regexp.MustCompile(`ID: +"([a-z]+\.[a-z0-9-]+)"`)

// TestRunbookCoversDoctor checks that every finding package doctor can
// report (other than its notes about itself) is named in RUNBOOK.md, so an
// operator who reads a finding's ID finds what it means for the symptoms.
func TestRunbookCoversDoctor(t *testing.T) {
	b, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, span := range codeSpans(string(b)) {
		named[span] = true
	}
	files, err := filepath.Glob("../../doctor/*.go")
	if err != nil {
		t.Fatal(err)
	}
	ids := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range findingID.FindAllStringSubmatch(string(src), -1) {
			ids++
			switch m[1] {
			case "broker.checks", "worker.options": // "no checks for this broker", "bad flags"
				continue
			}
			if !named[m[1]] {
				named[m[1]] = true // reported once
				t.Errorf("doctor finding %s (%s) is not named in RUNBOOK.md: add it to the section of the symptom it explains", m[1], filepath.Base(f))
			}
		}
	}
	if ids < 20 {
		t.Fatalf("found only %d doctor finding IDs in ../../doctor", ids)
	}
}

// readmeFile is the README, whose "berth doctor" section lists the findings.
const readmeFile = "../../README.md"

// emittedFindingIDs returns every finding ID berth doctor can print: the
// ID literals of package doctor and of the CLI's own findings
// (cmd/berth: ledger.tables-missing), the check-timeout finding's constant,
// and sdk's Conflict* IDs, which doctor reports through sdk.CheckConfig.
func emittedFindingIDs(t *testing.T) map[string]string {
	t.Helper()
	ids := map[string]string{}
	constID := regexp.MustCompile(`(?m)^\s*(?:const\s+)?(?:checkTimeoutID|Conflict[A-Za-z]+)\s*=\s*"([a-z]+\.[a-z0-9-]+)"`)
	for _, glob := range []string{"../../doctor/*.go", "../../cmd/berth/*.go", "../../sdk/config_check.go"} {
		files, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, re := range []*regexp.Regexp{findingID, constID} {
				for _, m := range re.FindAllStringSubmatch(string(src), -1) {
					ids[m[1]] = filepath.Base(f)
				}
			}
		}
	}
	if len(ids) < 40 {
		t.Fatalf("found only %d doctor finding IDs", len(ids))
	}
	return ids
}

// TestReadmeListsEveryDoctorFinding checks the table of README.md's
// "berth doctor" section against the findings berth doctor prints: every
// ID it can print has a row (berth doctor -h and RUNBOOK.md send operators
// there for what an ID means), and every row names an ID it prints.
func TestReadmeListsEveryDoctorFinding(t *testing.T) {
	b, err := os.ReadFile(readmeFile)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n### berth doctor\n")
	if !ok {
		t.Fatal(`README.md has no "### berth doctor" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	listed := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, id := range codeSpans(first) {
			listed[id] = true
		}
	}
	emitted := emittedFindingIDs(t)
	for id, file := range emitted {
		if !listed[id] {
			t.Errorf("doctor finding %s (%s) has no row in README.md's berth doctor table", id, file)
		}
	}
	for id := range listed {
		if _, ok := emitted[id]; !ok {
			t.Errorf("README.md's berth doctor table lists %s, which berth doctor never prints", id)
		}
	}
}
