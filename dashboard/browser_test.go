package dashboard_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// browser returns a chromedp context on a fresh headless Chromium (Debian's
// chromium package; scripts/test installs it). Without Chromium the test is
// skipped, except under CI=true, where it fails.
func browser(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if integration.InCI() {
			t.Fatal("browser: chromium is not installed (scripts/test installs it; apt-get install chromium)")
		}
		t.Skip("browser: chromium is not installed (apt-get install chromium)")
	}
	// Chromium's temporary files go to a directory of the test's, removed
	// when the test ends: its profile (else chromedp's in $TMPDIR) and what
	// it makes in $TMPDIR itself, the org.chromium.Chromium.* directories
	// (its singleton socket's), which it leaves behind when it is killed.
	// Not t.TempDir(), whose path holds the test's name: the socket's path
	// in it would pass the 107 bytes a Unix socket's path may have, and
	// Chromium would not start. The removal is registered before the
	// browser's stop, so it runs after it (cleanups run last first).
	tmp, err := os.MkdirTemp("", "berth-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Chromium's helper processes may outlive it for a moment and
		// still write to its profile: try again until they are gone.
		var err error
		for range 200 {
			if err = os.RemoveAll(tmp); err == nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Errorf("browser: remove its temporary files: %v", err)
	})
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(filepath.Join(tmp, "profile")),
		chromedp.Env("TMPDIR="+tmp),
		chromedp.Headless,
		chromedp.NoSandbox, // tests run as root in CI
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("no-first-run", true),
		chromedp.WindowSize(1280, 800),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	tctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { // before the removal of tmp
		// Closed, not killed, when it answers: Chromium then stops its
		// helpers and removes what it made in $TMPDIR itself.
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_ = chromedp.Cancel(cctx)
		cancel()
		cancelTimeout()
		cancelCtx()
		cancelAlloc() // waits for the browser's process to end
	})
	if err := chromedp.Run(tctx); err != nil { // starts the browser
		t.Fatalf("browser: start %s: %v", path, err)
	}
	return tctx
}

// artefacts is where screenshots go: $BERTH_ARTEFACTS when set (kept),
// else the test's temporary directory.
func artefacts(t *testing.T) string {
	if dir := os.Getenv("BERTH_ARTEFACTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.TempDir()
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	var png []byte
	if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil { // quality 100 makes a PNG
		t.Fatal(err)
	}
	path := filepath.Join(artefacts(t), name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d bytes)", path, len(png))
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	var s string
	if err := chromedp.Run(ctx, chromedp.Text(sel, &s, chromedp.ByQuery)); err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

func number(t *testing.T, ctx context.Context, sel string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(text(t, ctx, sel), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", sel, err)
	}
	return n
}

// clickNav clicks sel, which navigates, and waits until the new page's URL
// contains want and its element ready is there. The click is queued in the
// page so that the call returns before the navigation starts; queries that
// the navigation cuts short are tried again.
func clickNav(sel, want, ready string) chromedp.Action {
	return chromedp.ActionFunc(func(ctx context.Context) error {
		var before string
		if err := chromedp.Evaluate(`location.href`, &before).Do(ctx); err != nil {
			return err
		}
		if err := chromedp.Evaluate(`setTimeout(() => document.querySelector(`+strconv.Quote(sel)+`).click(), 0)`, nil).Do(ctx); err != nil {
			return err
		}
		check := `document.readyState === "complete" && location.href !== ` + strconv.Quote(before) +
			` && location.href.includes(` + strconv.Quote(want) + `) && document.querySelector(` + strconv.Quote(ready) + `) !== null`
		for {
			var ok bool
			if err := chromedp.Evaluate(check, &ok).Do(ctx); err == nil && ok {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("click %s: no page with %q and %s: %w", sel, want, ready, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
}

func run(t *testing.T, ctx context.Context, actions ...chromedp.Action) {
	t.Helper()
	if err := chromedp.Run(ctx, actions...); err != nil {
		t.Fatal(err)
	}
}

// operate drives the dashboard as an operator would: the overview shows the
// broker's counts and follows them live; the dead letters are filtered,
// some are selected and redriven after a confirmation stating their count,
// then every match of another filter is purged; the counts the pages show
// are the broker's, before and after.
func operate(t *testing.T, b broker, shots bool) {
	ctx := browser(t)
	seed(t, b, 12, 3) // transient: 0,3,6,9; refunds: 3,7,11
	srv := serve(t, b, dashboard.Options{Title: "test broker", PageSize: 5})

	// Overview.
	run(t, ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(`tr[data-queue="billing"]`, chromedp.ByQuery))
	if got := number(t, ctx, `tr[data-queue="billing"] td.dead_lettered`); got != 12 {
		t.Fatalf("overview dead-lettered %d, want 12", got)
	}
	if got := number(t, ctx, `tr[data-queue="billing"] td.ready`); got != 3 {
		t.Fatalf("overview ready %d, want 3", got)
	}
	// Live: a message published now shows without a reload.
	if err := b.Publish(context.Background(), "billing", &sdk.Message{Type: "billing.charge", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, chromedp.Poll(`document.querySelector('tr[data-queue="billing"] td.ready').textContent === "4"`, nil, chromedp.WithPollingTimeout(20*time.Second)))
	if shots {
		screenshot(t, ctx, "overview.png")
	}

	// Filter the dead letters: transient failures ("timeout").
	run(t, ctx,
		clickNav(`tr[data-queue="billing"] td.dead_lettered a`, "/queues/billing", "#dead-letters"),
	)
	if got := number(t, ctx, "#matched"); got != 12 {
		t.Fatalf("unfiltered: %d matching", got)
	}
	run(t, ctx,
		chromedp.SendKeys(`#f-reason`, "timeout", chromedp.ByQuery),
		clickNav(`#apply-filter`, "reason=timeout", "#dead-letters"),
	)
	if got, total := number(t, ctx, "#matched"), number(t, ctx, "#total"); got != 4 || total != 12 {
		t.Fatalf("filtered: %d of %d, want 4 of 12", got, total)
	}
	// Select two rows and redrive them.
	var firstID string
	run(t, ctx,
		chromedp.AttributeValue(`#dead-letters tbody tr:nth-child(1)`, "data-id", &firstID, nil, chromedp.ByQuery),
		chromedp.Click(`#dead-letters tbody tr:nth-child(1) input[name="id"]`, chromedp.ByQuery),
		chromedp.Click(`#dead-letters tbody tr:nth-child(2) input[name="id"]`, chromedp.ByQuery),
		clickNav(`#redrive`, "/confirm", "#confirm"),
	)
	if got := number(t, ctx, "#confirm-count"); got != 2 {
		t.Fatalf("confirmation states %d, want 2", got)
	}
	if st := stats(t, b); st.DeadLettered != 12 {
		t.Fatalf("changed before the confirmation: %+v", st)
	}
	run(t, ctx, clickNav(`#confirm`, "result=", "#flash"))
	if got := text(t, ctx, "#flash"); got != "redriven 2 dead letter(s)" {
		t.Fatalf("flash %q", got)
	}
	if got, total := number(t, ctx, "#matched"), number(t, ctx, "#total"); got != 2 || total != 10 {
		t.Fatalf("after redrive the page shows %d of %d, want 2 of 10", got, total)
	}
	if st := stats(t, b); st.DeadLettered != 10 || st.Ready != 6 {
		t.Fatalf("broker after redrive: %+v, want 10 dead, 6 ready", st)
	}
	if _, err := b.GetDeadLetter(context.Background(), "billing", firstID); err == nil {
		t.Fatalf("the selected %s is still a dead letter", firstID)
	}

	// Every match of another filter, across pages: purge the permanent ones.
	run(t, ctx,
		chromedp.Navigate(srv.URL+"/queues/billing?class=permanent"),
		chromedp.WaitVisible(`#dead-letters`, chromedp.ByQuery),
	)
	matched := number(t, ctx, "#matched")
	if matched != 8 {
		t.Fatalf("permanent: %d, want 8", matched)
	}
	run(t, ctx,
		chromedp.Click(`#all`, chromedp.ByQuery),
		clickNav(`#purge`, "action=purge", "#confirm"),
	)
	if got := number(t, ctx, "#confirm-count"); got != matched {
		t.Fatalf("confirmation states %d, want %d", got, matched)
	}
	run(t, ctx, clickNav(`#confirm`, "result=", "#flash"))
	if got := text(t, ctx, "#flash"); got != fmt.Sprintf("purged %d dead letter(s)", matched) {
		t.Fatalf("flash %q", got)
	}
	if st := stats(t, b); st.DeadLettered != 2 || st.Ready != 6 {
		t.Fatalf("broker after purge: %+v, want 2 dead, 6 ready", st)
	}
	run(t, ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(`tr[data-queue="billing"]`, chromedp.ByQuery))
	if got := number(t, ctx, `tr[data-queue="billing"] td.dead_lettered`); got != 2 {
		t.Fatalf("overview after: %d dead-lettered, want 2", got)
	}

	// One message.
	run(t, ctx,
		chromedp.Navigate(srv.URL+"/queues/billing"),
		chromedp.WaitVisible(`#dead-letters`, chromedp.ByQuery),
		clickNav(`#dead-letters tbody tr:nth-child(1) td.mono a`, "/messages/", "#body"),
	)
	if body := text(t, ctx, "#body"); !strings.Contains(body, "\"order\": \"o-") {
		t.Fatalf("body not pretty JSON: %q", body)
	}
	if reason := text(t, ctx, "#reason"); !strings.Contains(reason, "gateway timeout") {
		t.Fatalf("reason %q", reason)
	}
	if shots {
		screenshot(t, ctx, "message.png")
	}
}

func TestBrowserMemory(t *testing.T) { operate(t, memoryBroker(t), true) }

func TestBrowserPostgres(t *testing.T) { operate(t, postgresBroker(t), false) }
