package main

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// The bar of a change whose count is unknown (-yes with a filter: nothing
// was counted) is a spinner, whose goroutine the progressbar package stops
// only once the bar is finished, which Exit is not: before, it outlived
// the command, redrawing over what came after on the terminal.
func TestChangeSpinnerStops(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	b, _ := deadLettered(t, 30)
	r := berthEnv(t, context.Background(), b, env{progress: true}, "dlq", "redrive", "billing", "-class", "permanent", "-yes", "-page-size", "7")
	if r.code != 0 || !strings.Contains(r.out, "redriven 20 dead letter(s) of billing") || !strings.Contains(r.err, "redrive billing") {
		t.Fatalf("exit %d\nstdout %q\nstderr %q", r.code, r.out, r.err)
	}
}

// As TestChangeSpinnerStops, for the outbox: all parked rows with -yes
// are not counted first, so the bar is a spinner.
func TestOutboxSpinnerStops(t *testing.T) {
	_, dsn, table := parkedOutbox(t, 3)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var out, errOut strings.Builder
	code := run(context.Background(), []string{"outbox", "requeue", "-yes", "-db", dsn, "-table", table}, env{
		stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, progress: true,
		getenv: func(string) string { return "" }, open: openURL,
	})
	if code != 0 || !strings.Contains(out.String(), "requeued 3") {
		t.Fatalf("exit %d\nstdout %q", code, out.String())
	}
}
