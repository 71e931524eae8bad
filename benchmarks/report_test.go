package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain runs berthbench's main instead of the tests when
// BERTHBENCH_MAIN is set, so that tests can run the command as a child
// process and see its exit status, output and effect on files.
func TestMain(m *testing.M) {
	if os.Getenv("BERTHBENCH_MAIN") != "" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// doc is a BENCHMARKS.md with a generated block of three sections.
const doc = "# Benchmarks\n\nhand-written text\n\n" + beginMark + "\n\nold preamble\n\n" +
	"<!-- berthbench:scenario memory -->\n\nMeasured A.\n\n### memory table\n\n" +
	"<!-- berthbench:scenario sqs -->\n\nMeasured B.\n\n### sqs table\n\n" +
	"<!-- berthbench:scenario gone -->\n\nMeasured C.\n\n### a scenario since removed\n\n" +
	endMark + "\n\nmore hand-written text\n"

func inner(t *testing.T, d string) string {
	t.Helper()
	i, j := strings.Index(d, beginMark), strings.Index(d, endMark)
	if i < 0 || j < i {
		t.Fatalf("no markers in %q", d)
	}
	return d[i+len(beginMark) : j]
}

func names(b block) []string {
	var out []string
	for _, s := range b.sections {
		out = append(out, s.name)
	}
	return out
}

func TestParseBlockRoundTrip(t *testing.T) {
	in := inner(t, doc)
	b := parseBlock(in)
	if got := b.render(); got != in {
		t.Fatalf("render(parse(x)) differs from x:\n%q\n%q", got, in)
	}
	if want := []string{"memory", "sqs", "gone"}; !slices.Equal(names(b), want) {
		t.Fatalf("sections %v, want %v", names(b), want)
	}
	if b.preamble != "\n\nold preamble\n\n" {
		t.Fatalf("preamble %q", b.preamble)
	}
	if s, _ := b.find("sqs"); s.text != "\nMeasured B.\n\n### sqs table\n\n" {
		t.Fatalf("sqs section %q", s.text)
	}
}

func TestPartialRunKeepsOtherSections(t *testing.T) {
	order := []string{"memory", "rabbitmq", "sqs"}
	r := run{preamble: "\n\nnew preamble\n\n", partial: true,
		fresh: []section{{name: "sqs", text: "\n\nMeasured D.\n\n### new sqs table\n\n"}}}
	out, err := rewriteBlock(doc, r, order)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "# Benchmarks\n\nhand-written text\n\n"+beginMark) || !strings.HasSuffix(out, endMark+"\n\nmore hand-written text\n") {
		t.Fatalf("text outside the markers changed:\n%s", out)
	}
	b := parseBlock(inner(t, out))
	if want := []string{"memory", "sqs", "gone"}; !slices.Equal(names(b), want) {
		t.Fatalf("sections %v, want %v (a partial run keeps what it does not know)", names(b), want)
	}
	if s, _ := b.find("memory"); !strings.Contains(s.text, "Measured A.") {
		t.Fatalf("memory's section was not kept: %q", s.text)
	}
	if s, _ := b.find("sqs"); strings.Contains(s.text, "Measured B.") || !strings.Contains(s.text, "new sqs table") {
		t.Fatalf("sqs's section was not replaced: %q", s.text)
	}
	if b.preamble != r.preamble {
		t.Fatalf("preamble %q", b.preamble)
	}
}

func TestFailedScenarioKeepsItsLastGoodSection(t *testing.T) {
	order := []string{"memory", "rabbitmq", "sqs"}
	r := run{preamble: "\n\np\n\n",
		fresh: []section{{name: "memory", text: "\n\nMeasured E.\n\n"}},
		failed: map[string]error{
			"sqs":      errors.New("emulator down"),
			"rabbitmq": errors.New("connection refused <b>"),
		}}
	out, err := merge(inner(t, doc), r, order)
	if err != nil {
		t.Fatal(err)
	}
	b := parseBlock(out)
	if want := []string{"memory", "rabbitmq", "sqs"}; !slices.Equal(names(b), want) {
		t.Fatalf("sections %v, want %v (a full run drops removed scenarios)", names(b), want)
	}
	if s, _ := b.find("sqs"); !strings.Contains(s.text, "Measured B.") {
		t.Fatalf("sqs failed and lost its last good section: %q", s.text)
	}
	if s, _ := b.find("rabbitmq"); !strings.Contains(s.text, "not measured: connection refused") {
		t.Fatalf("rabbitmq failed with no earlier section; got %q", s.text)
	}
}

func TestPartialRunRefusesABlockWithoutSections(t *testing.T) {
	legacy := "\n\nGenerated long ago.\n\n### memory table\n\n### sqs table\n\n"
	r := run{preamble: "\n\np\n\n", partial: true, fresh: []section{{name: "sqs", text: "\n\nx\n\n"}}}
	if _, err := merge(legacy, r, []string{"memory", "sqs"}); !errors.Is(err, errLegacyBlock) {
		t.Fatalf("partial run over a block without sections: err %v, want errLegacyBlock", err)
	}
	r.partial = false
	out, err := merge(legacy, r, []string{"memory", "sqs"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "long ago") || !strings.Contains(out, "<!-- berthbench:scenario sqs -->") {
		t.Fatalf("a full run replaces the old block: %q", out)
	}
	// An empty block (a new document) takes a partial run.
	if _, err := merge("\n\n", run{partial: true}, []string{"sqs"}); err != nil {
		t.Fatalf("empty block: %v", err)
	}
}

// TestMergeRefusesTwoSectionsForOneScenario: a block in which one scenario
// has two sections (a hand edit, a merge of two branches) is refused, not
// rewritten with the first kept and the second dropped.
func TestMergeRefusesTwoSectionsForOneScenario(t *testing.T) {
	old := "\n\np\n\n" + fmt.Sprintf(sectionMark, "sqs") + "\n\nfirst\n\n" + fmt.Sprintf(sectionMark, "sqs") + "\n\nsecond\n\n"
	for _, partial := range []bool{false, true} {
		_, err := merge(old, run{partial: partial}, []string{"memory", "sqs"})
		if !errors.Is(err, errDuplicateSection) || !strings.Contains(err.Error(), `"sqs"`) {
			t.Errorf("partial %v: err %v, want errDuplicateSection naming sqs", partial, err)
		}
	}
}

func TestRewriteBlockNeedsMarkers(t *testing.T) {
	if _, err := rewriteBlock("no markers here", run{}, nil); err == nil {
		t.Fatal("no error without markers")
	}
	if _, err := rewriteBlock(endMark+beginMark, run{}, nil); err == nil {
		t.Fatal("no error with the markers out of order")
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"memory":     "memory",
		"rabbitmq-p": "rabbitmq-p",
		"^sqs$":      "'^sqs$'",
		"a b":        "'a b'",
		"it's":       `'it'\''s'`,
		"":           "''",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestBenchmarksMDSections checks that the repository's BENCHMARKS.md has a
// section for every scenario, in order, so that scripts/bench -only can
// rewrite one without dropping the others.
func TestBenchmarksMDSections(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, sc := range scenarios {
		order = append(order, sc.name)
	}
	got := names(parseBlock(inner(t, string(b))))
	if !slices.Equal(got, order) {
		t.Fatalf("BENCHMARKS.md's generated sections are %v, want the scenarios %v", got, order)
	}
}

// runMain runs berthbench with args as a child process and returns its
// combined output and exit error.
func runMain(t *testing.T, args ...string) (string, error) {
	t.Helper()
	// -quick and a deadline bound the damage should a regression make the
	// child measure after all.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-quick"}, args...)...)
	cmd.Env = append(os.Environ(), "BERTHBENCH_MAIN=1")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestCommandRefusesBeforeMeasuring runs the command where it must stop
// before measuring anything (these cases need no service) and leave the
// document as it was.
func TestCommandRefusesBeforeMeasuring(t *testing.T) {
	dir := t.TempDir()
	withSections := filepath.Join(dir, "sections.md")
	legacy := filepath.Join(dir, "legacy.md")
	legacyDoc := "x\n" + beginMark + "\n\nGenerated long ago.\n\n### memory table\n\n" + endMark + "\n"
	twice := filepath.Join(dir, "twice.md")
	twiceDoc := "x\n" + beginMark + "\n\np\n\n" + fmt.Sprintf(sectionMark, "sqs") + "\n\nold\n\n" + fmt.Sprintf(sectionMark, "sqs") + "\n\nnewer\n\n" + endMark + "\n"
	for path, text := range map[string]string{withSections: doc, legacy: legacyDoc, twice: twiceDoc} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, path, only, want string
	}{
		{"no scenario matches", withSections, "^nosuch$", "matches no scenario"},
		{"a partial run over a block without sections", legacy, "^memory$", errLegacyBlock.Error()},
		{"a block with two sections for one scenario", twice, "^memory$", errDuplicateSection.Error()},
	} {
		t.Run(c.name, func(t *testing.T) {
			before, err := os.ReadFile(c.path)
			if err != nil {
				t.Fatal(err)
			}
			out, err := runMain(t, "-only", c.only, "-write", c.path)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("exit %v, want status 1; output:\n%s", err, out)
			}
			if !strings.Contains(out, c.want) {
				t.Fatalf("output %q does not say %q", out, c.want)
			}
			if strings.Contains(out, "berthbench: memory...") {
				t.Fatalf("it measured before refusing:\n%s", out)
			}
			after, err := os.ReadFile(c.path)
			if err != nil {
				t.Fatal(err)
			}
			if string(after) != string(before) {
				t.Fatalf("the document changed:\n%s", after)
			}
			if _, err := os.Stat(filepath.Join(dir, "docs")); !os.IsNotExist(err) {
				t.Fatalf("docs/bench made before refusing: %v", err)
			}
		})
	}
}

// TestParseBlockRoundTripOddInput checks that parsing and rendering give back
// the text exactly for inputs a hand edit or a checkout can produce, and that a
// CRLF block still matches its sections by name.
func TestParseBlockRoundTripOddInput(t *testing.T) {
	crlf := strings.ReplaceAll(inner(t, doc), "\n", "\r\n")
	for _, in := range []string{
		crlf,
		"\n\np\n\n<!-- berthbench:scenario memory -->",                                       // marker last, no newline
		"\n\np\n\n<!-- berthbench:scenario memory -->\nA `<!-- berthbench:scenario x -->`\n", // marker-like text inside a line
		"",
	} {
		if got := parseBlock(in).render(); got != in {
			t.Errorf("render(parse(x)) differs from x:\n%q\n%q", got, in)
		}
	}
	if want := []string{"memory", "sqs", "gone"}; !slices.Equal(names(parseBlock(crlf)), want) {
		t.Fatalf("CRLF sections %q, want %q", names(parseBlock(crlf)), want)
	}
}

// TestFailureTextCannotOpenASection checks that an error's text, written into
// a "not measured" section, reads back as that section's text only.
func TestFailureTextCannotOpenASection(t *testing.T) {
	r := run{preamble: "\n\np\n\n", failed: map[string]error{
		"sqs": errors.New("bad body:\n<!-- berthbench:scenario x -->\n" + endMark)}}
	out, err := merge("", r, []string{"memory", "sqs"})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(parseBlock(out)); !slices.Equal(got, []string{"sqs"}) {
		t.Fatalf("sections %q, want [sqs]", got)
	}
	if strings.Contains(out, endMark) {
		t.Fatalf("the end marker got into the block: %q", out)
	}
}

// TestFailedScenarioExitsOneAndKeepsItsSection runs the command with the SQS
// scenario pointed at a closed port: it must fail fast, exit with status 1,
// and leave the document's sqs section (and every other) as it was.
func TestFailedScenarioExitsOneAndKeepsItsSection(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "BENCHMARKS.md")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BERTH_SQS_ENDPOINT", "http://127.0.0.1:1") // nothing listens on port 1
	out, err := runMain(t, "-only", "^sqs$", "-write", path)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1; output:\n%s", err, out)
	}
	if !strings.Contains(out, "not measured: sqs") {
		t.Fatalf("output does not name the failed scenario:\n%s", out)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := parseBlock(inner(t, string(after)))
	if s, _ := b.find("sqs"); !strings.Contains(s.text, "Measured B.") {
		t.Fatalf("the failed scenario lost its last good section: %q", s.text)
	}
	if want := []string{"memory", "sqs", "gone"}; !slices.Equal(names(b), want) {
		t.Fatalf("sections %v, want %v", names(b), want)
	}
}
