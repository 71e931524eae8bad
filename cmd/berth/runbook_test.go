package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/berthq/berth/internal/markdown"
)

// runbookCommands returns the berth command lines of a Markdown text: code
// spans and fenced code lines that start with "berth " once a prompt ("$ "),
// environment assignments ("BERTH_UI_TOKEN=… ") and "go run ./cmd/berth"
// are taken off.
func runbookCommands(md string) []string {
	var cmds []string
	assign := regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=('[^']*'|"[^"]*"|\S*)\s+`)
	for _, s := range markdown.CodeSpans(md) {
		s = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), "$ "))
		for assign.MatchString(s) {
			s = strings.TrimSpace(assign.ReplaceAllString(s, ""))
		}
		if rest, ok := strings.CutPrefix(s, "go run ./cmd/berth "); ok {
			s = "berth " + rest
		}
		if strings.HasPrefix(s, "berth ") {
			cmds = append(cmds, s)
		}
	}
	return cmds
}

// shellWords splits a command line as sh would, for the commands of the
// documents: quotes ('…', "…") group, an unquoted word starting with "#"
// begins a comment, and an unquoted |, &, ;, <, >, ( or ) is an error, as
// the shell would take it for an operator (a -reason /a|b/ pipes into a
// command named b/).
func shellWords(line string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // a word is under way
		quote rune
	)
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'', r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words, in = append(words, cur.String()), false
				cur.Reset()
			}
		case r == '#' && !in:
			return words, nil
		case strings.ContainsRune("|&;<>()", r):
			return nil, fmt.Errorf("unquoted %q: the shell takes it for an operator; quote the argument", r)
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unclosed %c quote", quote)
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

// checkDocCommands checks every berth command line of the Markdown file
// path (relative to the repository's root): the verb is one of the CLI's,
// each flag is one that verb (or every verb) accepts, and the shell would
// pass the line to berth as it is written. It returns the verbs used.
func checkDocCommands(t *testing.T, path string, min int) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../../" + path)
	if err != nil {
		t.Fatal(err)
	}
	cmds := map[string]*command{}
	for _, c := range commands() {
		cmds[c.name] = c
	}
	lines := runbookCommands(string(b))
	if len(lines) < min {
		t.Errorf("%s gives only %d berth commands", path, len(lines))
	}
	verbs := map[string]bool{}
	for _, line := range lines {
		all, err := shellWords(line)
		if err != nil {
			t.Errorf("%s `%s`: %v", path, line, err)
			continue
		}
		words := all[1:]
		var c *command
		if len(words) >= 2 {
			c = cmds[words[0]+" "+words[1]]
		}
		if c == nil && len(words) >= 1 {
			c = cmds[words[0]]
		}
		if c == nil {
			if len(words) > 0 && words[0] == "help" {
				continue
			}
			t.Errorf("%s `%s`: no such berth command", path, line)
			continue
		}
		verbs[c.name] = true
		for _, w := range words {
			if w == "--" {
				break // arguments from here on, as parseInterspersed reads them
			}
			if !strings.HasPrefix(w, "-") || w == "-" {
				continue
			}
			f, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
			if !slices.Contains(c.flags, f) && !slices.Contains(globalFlags, f) && f != "h" {
				t.Errorf("%s `%s`: berth %s has no flag -%s", path, line, c.name, f)
			}
		}
	}
	return verbs
}

// TestReadmeCommandsExist checks the berth command lines of README.md as
// TestRunbookCommandsExist does RUNBOOK.md's.
func TestReadmeCommandsExist(t *testing.T) {
	verbs := checkDocCommands(t, "README.md", 20)
	for _, v := range []string{"stats", "dlq list", "dlq show", "dlq redrive", "dlq purge", "outbox list", "outbox requeue", "job show", "jobs", "doctor", "queue pause", "ui"} {
		if !verbs[v] {
			t.Errorf("README.md never uses berth %s", v)
		}
	}
}

func TestShellWords(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
		err  bool
	}{
		{`berth dlq list billing -reason "unknown job type" # a comment`, []string{"berth", "dlq", "list", "billing", "-reason", "unknown job type"}, false},
		{`berth outbox list -db "$APP_DB"`, []string{"berth", "outbox", "list", "-db", "$APP_DB"}, false},
		{`berth dlq list billing -reason '/a|b/'`, []string{"berth", "dlq", "list", "billing", "-reason", "/a|b/"}, false},
		{`berth dlq list billing -reason /a|b/`, nil, true},
		{`berth dlq list billing -reason "a`, nil, true},
	} {
		got, err := shellWords(tc.line)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("shellWords(%s) = %q, %v; want %q, error %v", tc.line, got, err, tc.want, tc.err)
		}
	}
}

// routePattern turns a "GET /queues/{queue}" route of the dashboard into a
// regexp of the paths it serves.
func routePattern(route string) *regexp.Regexp {
	_, path, _ := strings.Cut(route, " ")
	path = strings.TrimSuffix(path, "{$}")
	re := regexp.QuoteMeta(path)
	re = regexp.MustCompile(`\\\{[a-z]+\\\}`).ReplaceAllString(re, `[^/]+`)
	return regexp.MustCompile("^" + re + "$")
}

// TestRunbookCommandsExist checks every berth command line RUNBOOK.md gives:
// the verb is one of the CLI's, and each flag is one that verb (or every
// verb) accepts. Paths of the web UI it names are routes of package
// dashboard.
func TestRunbookCommandsExist(t *testing.T) {
	verbs := checkDocCommands(t, "RUNBOOK.md", 15)
	b, err := os.ReadFile("../../RUNBOOK.md")
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	for _, v := range []string{"stats", "dlq list", "dlq show", "dlq redrive", "dlq purge", "job show", "jobs", "doctor"} {
		if !verbs[v] {
			t.Errorf("RUNBOOK.md never uses berth %s", v)
		}
	}

	src, err := os.ReadFile("../../dashboard/dashboard.go")
	if err != nil {
		t.Fatal(err)
	}
	var routes []*regexp.Regexp
	for _, m := range regexp.MustCompile(`"GET (/[^"]*)"`).FindAllStringSubmatch(string(src), -1) {
		routes = append(routes, routePattern("GET "+m[1]))
	}
	if len(routes) < 5 {
		t.Fatalf("found only %d dashboard routes in dashboard/dashboard.go", len(routes))
	}
	for _, span := range regexp.MustCompile("`(/[^` ]*)`").FindAllStringSubmatch(md, -1) {
		path := span[1]
		if path == "/livez" || path == "/readyz" { // package health's, served by the application
			continue
		}
		ok := false
		for _, r := range routes {
			ok = ok || r.MatchString(path)
		}
		if !ok {
			t.Errorf("RUNBOOK.md names UI page %s, which package dashboard does not serve", path)
		}
	}
}
