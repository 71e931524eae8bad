package main

import (
	"regexp"
	"strings"
	"testing"
)

// TestFlagHelpNamesItsCommands: a flag's help that says which commands it
// is for ("jobs: only jobs of this queue") names every command that takes
// it, so that "berth COMMAND -h" does not describe the flag as another
// command's. Before, -db said "outbox, job, jobs" under queue pause, doctor
// and ui, -schema left out doctor and ui, -limit spoke of list, redrive and
// purge under jobs, and -type, under jobs, said it took types
// comma-separated, which jobs refuses ("-type takes one type").
func TestFlagHelpNamesItsCommands(t *testing.T) {
	c := newCLI(env{})
	scope := regexp.MustCompile(`^([a-z][a-z ,]*): `)
	for _, cmd := range commands() {
		for _, name := range append(append([]string{}, cmd.flags...), globalFlags...) {
			f := c.fs.Lookup(name)
			if f == nil {
				t.Fatalf("%s: no flag -%s", cmd.name, name)
			}
			var named []string
			for _, part := range strings.Split(f.Usage, "; ") {
				if m := scope.FindStringSubmatch(part); m != nil {
					named = append(named, strings.FieldsFunc(m[1], func(r rune) bool { return r == ',' || r == ' ' })...)
				}
			}
			if len(named) == 0 {
				continue // for every command that takes it
			}
			ok := false
			for _, w := range strings.Fields(cmd.name) {
				ok = ok || contains(named, w)
			}
			if !ok {
				t.Errorf("berth %s -h: -%s says it is for %q: %s", cmd.name, name, named, f.Usage)
			}
		}
	}
	// -type: what jobs does with it (one type), not what dlq does.
	jobsType := ""
	for _, part := range strings.Split(c.fs.Lookup("type").Usage, "; ") {
		if strings.HasPrefix(part, "jobs: ") {
			jobsType = part
		}
	}
	if jobsType == "" || strings.Contains(jobsType, "comma") {
		t.Errorf("berth jobs -h: -type does not say that jobs takes one type: %s", c.fs.Lookup("type").Usage)
	}
	if r := cliDB(t, "", false, "jobs", "-type", "a,b", "-db", "postgres://127.0.0.1:1/x"); r.code != exitUsage {
		t.Errorf("jobs -type a,b: exit %d, want %d", r.code, exitUsage)
	}
}
