package dashboard_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/chromedp/chromedp"
)

// The browser tests' Chromium keeps its temporary files (its profile, and
// the org.chromium.Chromium.* directories it makes in $TMPDIR) in a
// directory of the test's own, which is gone once the test ends. Before,
// it ran with the process's TMPDIR (/tmp) and a profile of chromedp's
// there, and every run left org.chromium.Chromium.* directories in /tmp
// (Chromium is killed, not closed, and does not remove them). The test
// reads the running browser's environment and command line (/proc: the
// browser tests run on Linux).
func TestBrowserTempFilesInTestDir(t *testing.T) {
	var tmpdir, profile string
	// Registered before the browser's cleanups, so it runs after them.
	t.Cleanup(func() {
		for _, dir := range []string{tmpdir, profile} {
			if dir == "" {
				continue
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("%s is left behind (%v)", dir, err)
			}
		}
	})
	ctx := browser(t)
	pid := chromedp.FromContext(ctx).Browser.Process().Pid
	proc := func(name string) [][]byte {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), name))
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Split(b, []byte{0})
	}
	for _, kv := range proc("environ") {
		if v, ok := bytes.CutPrefix(kv, []byte("TMPDIR=")); ok {
			tmpdir = string(v) // the last one counts
		}
	}
	for _, arg := range proc("cmdline") {
		if v, ok := bytes.CutPrefix(arg, []byte("--user-data-dir=")); ok {
			profile = string(v)
		}
	}
	shared := filepath.Clean(os.TempDir())
	if tmpdir == "" || filepath.Clean(tmpdir) == shared {
		t.Fatalf("Chromium's TMPDIR is %q, want a directory of the test's own, not %s", tmpdir, shared)
	}
	if rel, err := filepath.Rel(tmpdir, profile); err != nil || !filepath.IsLocal(rel) {
		t.Errorf("Chromium's --user-data-dir is %q, want a directory in its TMPDIR %s", profile, tmpdir)
	}
	// Chromium does put its org.chromium.Chromium.* directory there.
	if m, _ := filepath.Glob(filepath.Join(tmpdir, "org.chromium.Chromium.*")); len(m) == 0 {
		t.Errorf("no org.chromium.Chromium.* in Chromium's TMPDIR %s", tmpdir)
	}
}
