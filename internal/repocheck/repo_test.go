package repocheck

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// root is the module root, two levels above this package.
const root = "../.."

// TestHardening16_NoExternalDesignDoc fails when a file of the repository
// cites design notes that live outside it (the banned names below)
// instead of ARCHITECTURE.md, or when ARCHITECTURE.md is missing.
func TestHardening16_NoExternalDesignDoc(t *testing.T) {
	if _, err := os.Stat(filepath.Join(root, "ARCHITECTURE.md")); err != nil {
		t.Fatalf("ARCHITECTURE.md: %v", err)
	}
	// Built from parts so that this file does not cite them itself.
	banned := []string{"DESIGN" + ".md", "../" + "shared"}
	var cites []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".sql", ".sh", ".yml", ".yaml", ".txt", ".html", ".js":
		default:
			if filepath.Dir(path) != filepath.Join(root, "scripts") {
				return nil
			}
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, s := range banned {
			if bytes.Contains(b, []byte(s)) {
				rel, _ := filepath.Rel(root, path)
				cites = append(cites, rel+" cites "+s)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cites {
		t.Errorf("%s; point it at ARCHITECTURE.md", c)
	}
}

// TestHardening16_License checks the repository carries the full Apache
// License 2.0 text.
func TestHardening16_License(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	if err != nil {
		t.Fatalf("LICENSE: %v", err)
	}
	for _, want := range []string{"Apache License", "Version 2.0, January 2004",
		"TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "END OF TERMS AND CONDITIONS"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("LICENSE lacks %q: not the full Apache-2.0 text", want)
		}
	}
}

// TestHardening16_GoDirective checks that go.mod's go directive is the
// oldest the dependencies allow — the highest go line among the modules of
// the build graph — and that no toolchain line forces a newer Go on those
// who adopt berth.
func TestHardening16_GoDirective(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var directive string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "go" {
			directive = f[1]
		}
		if len(f) >= 1 && f[0] == "toolchain" {
			t.Errorf("go.mod has %q: adopting berth would force that toolchain", strings.TrimSpace(line))
		}
	}
	if directive == "" {
		t.Fatal("go.mod has no go directive")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	cmd := exec.Command(gobin, "list", "-mod=readonly", "-m", "-f", "{{if not .Main}}{{.Path}} {{.GoVersion}}{{end}}", "all")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, stderr.String())
	}
	need, from := "", ""
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if need == "" || compareGo(f[1], need) > 0 {
			need, from = f[1], f[0]
		}
	}
	if need == "" {
		t.Fatal("go list -m all reported no go versions")
	}
	if compareGo(directive, need) != 0 {
		t.Errorf("go directive %s; the dependencies need %s (%s): lower (or raise) it to that", directive, need, from)
	}
}

// compareGo compares Go versions such as 1.26, 1.26.0 and 1.26.8 (1.26 is
// the same language version as 1.26.0 for this purpose).
func compareGo(a, b string) int {
	pa, pb := goParts(a), goParts(b)
	for i := range 3 {
		if pa[i] != pb[i] {
			if pa[i] < pb[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

func goParts(v string) [3]int {
	var p [3]int
	for i, s := range strings.SplitN(v, ".", 3) {
		s, _, _ = strings.Cut(s, "rc")
		p[i], _ = strconv.Atoi(s)
	}
	return p
}

// TestNoDockerInUserTestBinaries: a user's test that uses berth's test kit
// (berthtest, berthtest/pgtest) or asks package integration for an endpoint
// links no container library; Docker's client comes only with
// integration/containers, imported on purpose. The shop example's test is
// the user's test of issue 16's acceptance.
func TestNoDockerInUserTestBinaries(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	for _, args := range [][]string{
		{"./berthtest/...", "./examples/shop"}, // with their tests
		{"./integration"},                      // the package alone: its own tests ask for containers
	} {
		cmdArgs := []string{"list", "-deps", "-f", "{{.ImportPath}}"}
		if args[0] != "./integration" {
			cmdArgs = append(cmdArgs, "-test")
		}
		cmd := exec.Command(gobin, append(cmdArgs, args...)...)
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %v: %v\n%s", args, err, stderr.String())
		}
		for _, pkg := range strings.Fields(string(out)) {
			if strings.Contains(pkg, "docker") || strings.Contains(pkg, "moby") || strings.Contains(pkg, "dockertest") {
				t.Errorf("%v links %s", args, pkg)
			}
		}
	}
}
