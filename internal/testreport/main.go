// Command testreport reads `go test -json` on standard input and prints what
// a person reviewing a CI run needs: a line per package as in `go test`, the
// output of every failed test, every skipped test with its reason, and a
// closing line "tests: N passed, N failed, N skipped".
//
// It exits 1 when a test failed, a package failed to build, or a test was
// skipped for want of a service (the integration helpers' "integration:"
// reason): integration tests must never pass by skipping.
//
//	go test -json ./... | go run ./internal/testreport
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action     string
	Package    string
	Test       string
	Elapsed    float64
	Output     string
	ImportPath string // build-output, build-fail
}

type key struct{ pkg, test string }

func main() {
	os.Exit(report(os.Stdin, os.Stdout))
}

func report(in io.Reader, out io.Writer) int {
	outputs := map[key]*strings.Builder{}
	var failed, skipped []key
	passed := 0
	bad := false
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, string(line)) // not test2json: pass it through
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "build-output":
			fmt.Fprint(out, e.Output)
		case "build-fail":
			bad = true
		case "output":
			b := outputs[k]
			if b == nil {
				b = &strings.Builder{}
				outputs[k] = b
			}
			b.WriteString(e.Output)
		case "pass", "fail", "skip":
			if e.Test == "" { // a package finished
				printPackage(out, e, outputs[k])
				if e.Action == "fail" {
					bad = true
				}
				continue
			}
			switch e.Action {
			case "pass":
				passed++
				delete(outputs, k)
			case "fail":
				failed = append(failed, k)
				bad = true
			case "skip":
				skipped = append(skipped, k)
			}
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(out, "testreport:", err)
		bad = true
	}

	if len(failed) > 0 {
		fmt.Fprintln(out, "\n== failed tests")
		for _, k := range failed {
			fmt.Fprintf(out, "--- FAIL: %s %s\n%s", k.pkg, k.test, body(outputs[k]))
		}
	}
	fmt.Fprintln(out, "\n== skipped tests and their reasons")
	if len(skipped) == 0 {
		fmt.Fprintln(out, "(none)")
	}
	sort.Slice(skipped, func(i, j int) bool {
		if skipped[i].pkg != skipped[j].pkg {
			return skipped[i].pkg < skipped[j].pkg
		}
		return skipped[i].test < skipped[j].test
	})
	for _, k := range skipped {
		reason := strings.TrimSpace(body(outputs[k]))
		fmt.Fprintf(out, "%s %s: %s\n", k.pkg, k.test, strings.ReplaceAll(reason, "\n", " | "))
		if strings.Contains(reason, "integration:") {
			fmt.Fprintf(out, "  ^ FAIL: an integration test skipped for want of a service\n")
			bad = true
		}
	}
	fmt.Fprintf(out, "\ntests: %d passed, %d failed, %d skipped\n", passed, len(failed), len(skipped))
	if bad {
		return 1
	}
	return 0
}

func printPackage(out io.Writer, e event, b *strings.Builder) {
	switch e.Action {
	case "pass":
		fmt.Fprintf(out, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
	case "skip":
		fmt.Fprintf(out, "?   \t%s\t[no test files]\n", e.Package)
	case "fail":
		if b != nil { // package-level output: panics, goleak, TestMain
			fmt.Fprint(out, body(b))
		}
		fmt.Fprintf(out, "FAIL\t%s\t%.3fs\n", e.Package, e.Elapsed)
	}
}

// body is a test's output without the runner's own lines.
func body(b *strings.Builder) string {
	if b == nil {
		return ""
	}
	var keep []string
	for _, l := range strings.SplitAfter(b.String(), "\n") {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- PASS") || strings.HasPrefix(t, "--- SKIP") || t == "PASS" {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "")
}
