package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/berthq/berth/internal/markdown"
)

// runbookCommands returns the berth command lines of a Markdown text: code
// spans and fenced code lines that start with "berth ".
func runbookCommands(md string) []string {
	var cmds []string
	for _, s := range markdown.CodeSpans(md) {
		s = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), "$ "))
		if strings.HasPrefix(s, "berth ") {
			cmds = append(cmds, s)
		}
	}
	return cmds
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
	b, err := os.ReadFile("../../RUNBOOK.md")
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	cmds := map[string]*command{}
	for _, c := range commands() {
		cmds[c.name] = c
	}
	lines := runbookCommands(md)
	if len(lines) < 15 {
		t.Errorf("RUNBOOK.md gives only %d berth commands", len(lines))
	}
	verbs := map[string]bool{}
	for _, line := range lines {
		words := strings.Fields(line)[1:]
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
			t.Errorf("RUNBOOK.md `%s`: no such berth command", line)
			continue
		}
		verbs[c.name] = true
		for _, w := range words {
			if !strings.HasPrefix(w, "-") || w == "-" {
				continue
			}
			f, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
			if !slices.Contains(c.flags, f) && !slices.Contains(globalFlags, f) && f != "h" {
				t.Errorf("RUNBOOK.md `%s`: berth %s has no flag -%s", line, c.name, f)
			}
		}
	}
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
