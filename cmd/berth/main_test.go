package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A test that needs the real process (signals) runs this binary as the
	// berth command, with the arguments in BERTH_CLI_ARGS.
	if args, ok := os.LookupEnv("BERTH_CLI_ARGS"); ok {
		os.Args = append([]string{"berth"}, strings.Split(args, "\x1f")...)
		main()
		return
	}
	// The SQS broker that brokerurl opens (TestOnSQS) runs on the AWS SDK's
	// default HTTP client, whose pool nobody can close: its idle keep-alive
	// connections outlive the test (a CLI process exits with them).
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"))
}

// deadLettered returns a memory broker whose queue "billing" holds one ready
// message and n dead letters: the i-th has type billing.charge (even i) or
// billing.refund (odd i); i%3 == 0 failed transiently ("timeout i"), the
// others permanently ("order i missing").
func deadLettered(t *testing.T, n int) (*memory.Broker, []string) {
	t.Helper()
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	var ids []string
	for i := 0; i < n; i++ {
		typ := "billing.charge"
		if i%2 == 1 {
			typ = "billing.refund"
		}
		m := &sdk.Message{Type: typ, Body: fmt.Appendf(nil, `{"n":%d}`, i)}
		if err := b.Publish(ctx, "billing", m); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Receive(ctx, "billing", 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("receive: %d %v", len(ds), err)
		}
		cause := sdk.Permanent(fmt.Errorf("order %d missing", i))
		if i%3 == 0 {
			cause = fmt.Errorf("timeout %d", i)
		}
		if err := ds[0].DeadLetter(ctx, cause); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}
	if err := b.Publish(ctx, "billing", &sdk.Message{Type: "billing.charge", Body: []byte(`{"ready":true}`)}); err != nil {
		t.Fatal(err)
	}
	return b, ids
}

type result struct {
	out, err string
	code     int
}

// berth runs the CLI on b with the options of e set by the caller (stdin,
// interactive, progress).
func berthEnv(t *testing.T, ctx context.Context, b *memory.Broker, e env, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	e.stdout, e.stderr = &out, &errOut
	if e.stdin == nil {
		e.stdin = strings.NewReader("")
	}
	e.getenv = func(string) string { return "" }
	if e.open == nil {
		e.open = func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil }
	}
	code := run(ctx, append([]string{"-url", "mem://"}, args...), e)
	return result{out.String(), errOut.String(), code}
}

func berth(t *testing.T, b *memory.Broker, args ...string) result {
	t.Helper()
	return berthEnv(t, context.Background(), b, env{}, args...)
}

// nopClose keeps the test's broker open across commands.
type nopClose struct{ *memory.Broker }

func (nopClose) Close() error { return nil }

func stats(t *testing.T, b *memory.Broker) sdk.QueueStats {
	t.Helper()
	st, err := b.Stats(context.Background(), "billing")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStats(t *testing.T) {
	b, _ := deadLettered(t, 2)
	_ = b.Publish(context.Background(), "emails", &sdk.Message{Type: "email.send", Body: []byte("{}")})
	r := berth(t, b, "stats", "billing", "-json")
	var st jsonStats
	if r.code != 0 || json.Unmarshal([]byte(r.out), &st) != nil {
		t.Fatalf("exit %d: %s %s", r.code, r.out, r.err)
	}
	if len(st.Queues) != 1 || st.Queues[0].Queue != "billing" || st.Queues[0].Ready != 1 || st.Queues[0].DeadLettered != 2 {
		t.Fatalf("stats %+v", st)
	}
	// No queue named: every queue the broker lists.
	r = berth(t, b, "stats")
	if r.code != 0 || !strings.Contains(r.out, "billing") || !strings.Contains(r.out, "emails") || !strings.Contains(r.out, "QUEUE") {
		t.Fatalf("all queues (exit %d): %s", r.code, r.out)
	}
	// -watch prints again until interrupted, then exits 0.
	ctx, cancel := context.WithCancel(context.Background())
	out := &watchWriter{cancelAfter: 3, cancel: cancel}
	code := run(ctx, []string{"-url", "mem://", "stats", "-json", "-watch", "-interval", "10ms", "billing", "emails"}, env{
		stdin: strings.NewReader(""), stdout: out, stderr: &bytes.Buffer{}, getenv: func(string) string { return "" },
		open: func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil },
	})
	if code != 0 || out.lines < 3 {
		t.Fatalf("-watch: exit %d after %d snapshots", code, out.lines)
	}
}

// vanishing lists a queue that is deleted before its Stats are read.
type vanishing struct{ nopClose }

func (v vanishing) Queues(ctx context.Context) ([]string, error) {
	qs, err := v.Broker.Queues(ctx)
	return append(qs, "gone"), err
}

func (v vanishing) Stats(ctx context.Context, q string) (sdk.QueueStats, error) {
	if q == "gone" {
		return sdk.QueueStats{}, fmt.Errorf("%w: queue gone", sdk.ErrNotFound)
	}
	return v.Broker.Stats(ctx, q)
}

// TestStatsSkipsAQueueDeletedMeanwhile: "berth stats" of every queue leaves
// out one deleted between the listing and its Stats, as other queues are
// deleted while an operator looks; a queue named on the command line and
// missing is still an error (exit 3).
func TestStatsSkipsAQueueDeletedMeanwhile(t *testing.T) {
	b, _ := deadLettered(t, 1)
	e := env{open: func(context.Context, string) (sdk.Broker, error) { return vanishing{nopClose{b}}, nil }}
	r := berthEnv(t, context.Background(), b, e, "stats")
	if r.code != exitOK || !strings.Contains(r.out, "billing") || strings.Contains(r.out, "gone") {
		t.Fatalf("stats of every queue: exit %d\n%s%s", r.code, r.out, r.err)
	}
	if r := berthEnv(t, context.Background(), b, e, "stats", "gone"); r.code != exitNotFound {
		t.Errorf("stats of a named missing queue: exit %d %s", r.code, r.err)
	}
}

// watchWriter cancels the run after some lines.
type watchWriter struct {
	lines, cancelAfter int
	cancel             func()
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.lines += bytes.Count(p, []byte("\n"))
	if w.lines >= w.cancelAfter {
		w.cancel()
	}
	return len(p), nil
}

func TestFlagsBeforeAndAfter(t *testing.T) {
	b, ids := deadLettered(t, 3)
	for _, args := range [][]string{
		{"-json", "dlq", "show", "billing", ids[0]},
		{"dlq", "show", "billing", ids[0], "-json"},
		{"dlq", "show", "-json", "billing", ids[0]},
		{"dlq", "-json", "show", "billing", "--", ids[0]},
	} {
		r := berth(t, b, args...)
		var m dlq.Message
		if r.code != 0 || json.Unmarshal([]byte(r.out), &m) != nil || m.ID != ids[0] {
			t.Errorf("berth %v: exit %d %s %s", args, r.code, r.out, r.err)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	b, _ := deadLettered(t, 1)
	for _, c := range []struct {
		args []string
		says string
	}{
		{nil, "usage: berth"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"dlq", "list"}, "want exactly one QUEUE"},
		{[]string{"dlq", "zap", "billing"}, `unknown command "dlq zap"`},
		{[]string{"dlq", "show", "billing"}, "want QUEUE and ID"},
		{[]string{"dlq", "list", "billing", "-limit", "x"}, `invalid value "x" for flag -limit`}, // the flag package's words, shown as they are
		{[]string{"dlq", "list", "billing", "-nope"}, "flag provided but not defined: -nope"},
		{[]string{"stats", "-yes"}, `-yes does not apply to "stats"`},
		{[]string{"dlq", "list", "billing", "-reason", "/([/"}, "-reason"},
		{[]string{"dlq", "list", "billing", "-limit", "-3"}, "must not be negative"},
		{[]string{"doctor", "billing", "-worker-prefetch", "-1"}, "-worker-prefetch must not be negative"},
		{[]string{"dlq", "redrive", "billing"}, "without -yes"},
		{[]string{"stats", "-interval", "0s"}, "-interval"},
	} {
		r := berth(t, b, c.args...)
		if r.code != exitUsage || !strings.Contains(r.err, c.says) {
			t.Errorf("berth %v: exit %d, stderr %q; want 2 and %q", c.args, r.code, r.err, c.says)
		}
	}
	if st := stats(t, b); st.DeadLettered != 1 {
		t.Fatalf("a usage error changed something: %+v", st)
	}
}

func TestHelpPerCommand(t *testing.T) {
	b, _ := deadLettered(t, 1)
	for _, args := range [][]string{{"dlq", "redrive", "-h"}, {"help", "dlq", "redrive"}, {"-h", "dlq", "redrive", "billing"}} {
		r := berth(t, b, args...)
		if r.code != 0 || !strings.Contains(r.out, "usage: berth dlq redrive QUEUE [ID...]") || !strings.Contains(r.out, "-dry-run") || strings.Contains(r.out, "-watch") {
			t.Errorf("berth %v: exit %d\n%s", args, r.code, r.out)
		}
	}
	r := berth(t, b, "-h")
	if r.code != 0 || !strings.Contains(r.out, "dlq purge") || !strings.Contains(r.out, "4 partial") {
		t.Fatalf("berth -h: %s", r.out)
	}
}

func TestExitCodes(t *testing.T) {
	b, ids := deadLettered(t, 3)
	// 0: done.
	if r := berth(t, b, "dlq", "list", "billing"); r.code != exitOK {
		t.Errorf("list: %d %s", r.code, r.err)
	}
	// 1: an error of the broker.
	down := func(context.Context, string) (sdk.Broker, error) { return nil, errors.New("connection refused") }
	if r := berthEnv(t, context.Background(), b, env{open: down}, "stats", "billing"); r.code != exitError || !strings.Contains(r.err, "connection refused") {
		t.Errorf("broker down: %d %s", r.code, r.err)
	}
	// 2: usage (more in TestUsageErrors).
	if r := berth(t, b, "dlq"); r.code != exitUsage {
		t.Errorf("dlq: %d", r.code)
	}
	// 3: not found, nothing matched.
	if r := berth(t, b, "dlq", "show", "billing", "no-such-id"); r.code != exitNotFound || !strings.Contains(r.err, "no-such-id") {
		t.Errorf("show missing: %d %s", r.code, r.err)
	}
	if r := berth(t, b, "dlq", "list", "billing", "-reason", "no such reason"); r.code != exitNotFound {
		t.Errorf("list nothing: %d %s", r.code, r.err)
	}
	if r := berth(t, b, "dlq", "redrive", "billing", "-type", "nope", "-yes"); r.code != exitNotFound {
		t.Errorf("redrive nothing: %d %s", r.code, r.err)
	}
	// 4: partial — one of the chosen IDs is not a dead letter; the others move.
	r := berth(t, b, "dlq", "redrive", "billing", ids[0], "no-such-id", ids[1], "-yes")
	if r.code != exitPartial || !strings.Contains(r.out, "redriven 2 ") || !strings.Contains(r.out, "not redriven: no-such-id") {
		t.Errorf("partial: %d\n%s%s", r.code, r.out, r.err)
	}
	if st := stats(t, b); st.DeadLettered != 1 || st.Ready != 3 {
		t.Errorf("after partial: %+v", st)
	}
}

// An interrupted redrive exits 4 and has moved exactly what it reports.
func TestInterrupted(t *testing.T) {
	b, _ := deadLettered(t, 12)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	counting := &cancelAfterPages{Broker: b, pages: 2, cancel: cancel}
	r := berthEnv(t, ctx, b, env{open: func(context.Context, string) (sdk.Broker, error) { return counting, nil }},
		"dlq", "redrive", "billing", "-yes", "-page-size", "5", "-json")
	var rep jsonChange
	if r.code != exitPartial || json.Unmarshal([]byte(r.out), &rep) != nil || !rep.Interrupted {
		t.Fatalf("exit %d: %s %s", r.code, r.out, r.err)
	}
	st := stats(t, b)
	if rep.Done != 10 || st.Ready != 1+10 || st.DeadLettered != 2 {
		t.Fatalf("report %+v, stats %+v", rep, st)
	}
}

// cancelAfterPages cancels the run after its n-th page, as SIGINT would.
type cancelAfterPages struct {
	*memory.Broker
	pages  int
	cancel func()
}

func (c *cancelAfterPages) Close() error { return nil }

func (c *cancelAfterPages) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	n, err := c.Broker.RedriveDeadLetters(ctx, queue, ids...)
	if c.pages--; c.pages == 0 {
		c.cancel()
	}
	return n, err
}

func TestConfirmation(t *testing.T) {
	b, _ := deadLettered(t, 4)
	// No terminal, no -yes: refused, nothing changed.
	if r := berth(t, b, "dlq", "purge", "billing"); r.code != exitUsage || stats(t, b).DeadLettered != 4 {
		t.Fatalf("purge without -yes: %d %s", r.code, r.err)
	}
	// A terminal: the question states the count; "n" changes nothing.
	r := berthEnv(t, context.Background(), b, env{interactive: true, stdin: strings.NewReader("n\n")}, "dlq", "purge", "billing", "-class", "permanent")
	if r.code != exitError || !strings.Contains(r.err, "delete 2 dead letter(s) of billing for good? [y/N]") || stats(t, b).DeadLettered != 4 {
		t.Fatalf("answered n: %d %s", r.code, r.err)
	}
	// "y" does it.
	r = berthEnv(t, context.Background(), b, env{interactive: true, stdin: strings.NewReader("y\n")}, "dlq", "redrive", "billing")
	if r.code != exitOK || !strings.Contains(r.err, "redrive 4 dead letter(s) of billing? [y/N]") || !strings.Contains(r.out, "redriven 4 dead letter(s)") {
		t.Fatalf("answered y: %d %s %s", r.code, r.out, r.err)
	}
	if st := stats(t, b); st.DeadLettered != 0 || st.Ready != 5 {
		t.Fatalf("after redrive: %+v", st)
	}
}

func TestDryRun(t *testing.T) {
	b, ids := deadLettered(t, 6)
	r := berth(t, b, "dlq", "purge", "billing", "-reason", "timeout", "-dry-run")
	if r.code != exitOK || !strings.Contains(r.out, "would purge 2 dead letter(s) of billing; nothing changed") || !strings.Contains(r.out, "timeout 3") {
		t.Fatalf("dry run: %d\n%s%s", r.code, r.out, r.err)
	}
	// A named ID that is not a dead letter: the change would exit 4 for
	// it (TestExitCodes), and so does its dry run.
	r = berth(t, b, "-json", "dlq", "redrive", "billing", ids[0], "gone", "-dry-run")
	var rep jsonChange
	if r.code != exitPartial || json.Unmarshal([]byte(r.out), &rep) != nil || !rep.DryRun || rep.Matched != 1 || rep.Missed != 1 || rep.Failed[0].ID != "gone" || rep.Done != 0 {
		t.Fatalf("dry run json: %d %s", r.code, r.out)
	}
	r = berth(t, b, "dlq", "purge", "billing", ids[0], "gone", "-dry-run")
	if r.code != exitPartial || !strings.Contains(r.out, "not a dead letter of billing: gone") || !strings.Contains(r.err, "not among the dead letters") {
		t.Fatalf("dry run text: %d\n%s%s", r.code, r.out, r.err)
	}
	// Only IDs that are not dead letters: nothing matches (3), in a dry run
	// as in the change.
	for _, mode := range []string{"-dry-run", "-yes"} {
		if r := berth(t, b, "dlq", "redrive", "billing", "gone", "gone-too", mode); r.code != exitNotFound {
			t.Errorf("redrive of IDs none of which is a dead letter, %s: exit %d\n%s%s", mode, r.code, r.out, r.err)
		}
	}
	if st := stats(t, b); st.DeadLettered != 6 {
		t.Fatalf("a dry run changed something: %+v", st)
	}
	if r := berth(t, b, "dlq", "redrive", "billing", "-class", "nope", "-dry-run"); r.code != exitNotFound {
		t.Fatalf("dry run of nothing: %d", r.code)
	}
}

func list(t *testing.T, b *memory.Broker, args ...string) jsonList {
	t.Helper()
	r := berth(t, b, append([]string{"-json", "dlq", "list", "billing"}, args...)...)
	var l jsonList
	if (r.code != exitOK && r.code != exitNotFound) || json.Unmarshal([]byte(r.out), &l) != nil {
		t.Fatalf("list %v: %d %s %s", args, r.code, r.out, r.err)
	}
	return l
}

func TestFilters(t *testing.T) {
	b, _ := deadLettered(t, 9) // 0..8: transient 0,3,6; refunds 1,3,5,7
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 9},
		{[]string{"-type", "billing.refund"}, 4},
		{[]string{"-type", "billing.refund,billing.charge"}, 9},
		{[]string{"-class", "permanent"}, 6},
		{[]string{"-class", "transient"}, 3},
		{[]string{"-reason", "missing"}, 6},
		{[]string{"-reason", "/^timeout [36]$/"}, 2},
		{[]string{"-reason", "/^permanent: order [0-9] missing$/", "-type", "billing.charge"}, 3},
		{[]string{"-older-than", "1h"}, 0},
		{[]string{"-newer-than", "1h"}, 9},
	} {
		if l := list(t, b, c.args...); l.Matched != c.want || !l.Complete {
			t.Errorf("list %v: %d matched, want %d", c.args, l.Matched, c.want)
		}
	}
	// -limit on a change moves no more than that.
	r := berth(t, b, "dlq", "redrive", "billing", "-class", "permanent", "-limit", "4", "-yes", "-page-size", "3")
	if r.code != 0 || !strings.Contains(r.out, "redriven 4 ") || stats(t, b).DeadLettered != 5 {
		t.Fatalf("redrive -limit: %d %s %s", r.code, r.out, r.err)
	}
}

func TestTotalsAndPages(t *testing.T) {
	b, ids := deadLettered(t, 7)
	r := berth(t, b, "dlq", "list", "billing", "-limit", "3")
	if r.code != 0 || !strings.Contains(r.out, "dead letters 1-3 of 7\n") || !strings.Contains(r.out, "next page: -offset 3") {
		t.Fatalf("page 1: %s", r.out)
	}
	l := list(t, b, "-limit", "3", "-offset", "6")
	if l.Matched != 7 || len(l.Messages) != 1 || l.Messages[0].ID != ids[6] || l.NextOffset != nil || *l.TotalDeadLetters != 7 {
		t.Fatalf("last page: %+v", l)
	}
	if l = list(t, b, "-limit", "1", "-class", "permanent"); *l.NextOffset != 1 {
		t.Fatalf("next offset %+v", l)
	}
	l = list(t, b, "-limit", "2", "-offset", "2", "-class", "permanent")
	if l.Matched != 4 || len(l.Messages) != 2 || l.Messages[0].ID != ids[4] || l.Messages[1].ID != ids[5] || l.NextOffset != nil {
		t.Fatalf("filtered page: %+v", l)
	}
	r = berth(t, b, "dlq", "list", "billing", "-class", "permanent", "-limit", "2")
	if !strings.Contains(r.out, "dead letters 1-2 of 4 matching (7 in the dead-letter queue of billing)") {
		t.Fatalf("filtered text: %s", r.out)
	}
}

func TestEscaping(t *testing.T) {
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const evil = "\x1b]0;pwned\x07\x1b[2J\u202eevil\u009b31m"
	m := &sdk.Message{Type: "billing.charge", Body: []byte("line1\n\x1b[31mred\x1b[0m"), Headers: map[string]string{"note": evil}}
	if err := b.Publish(ctx, "billing", m); err != nil {
		t.Fatal(err)
	}
	ds, _ := b.Receive(ctx, "billing", 1)
	if err := ds[0].DeadLetter(ctx, errors.New("bad input: "+evil)); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"dlq", "list", "billing"}, {"dlq", "show", "billing", m.ID}, {"dlq", "redrive", "billing", "-dry-run"}} {
		r := berth(t, b, args...)
		if r.code != 0 {
			t.Fatalf("%v: %d %s", args, r.code, r.err)
		}
		for _, raw := range []string{"\x1b", "\x07", "\u202e", "\u009b"} {
			if strings.Contains(r.out, raw) || strings.Contains(r.err, raw) {
				t.Errorf("%v printed %q raw:\n%s", args, raw, r.out)
			}
		}
		if !strings.Contains(r.out, `\x1b]0;pwned\a\x1b[2J\u202eevil\u009b31m`) {
			t.Errorf("%v: the escaped reason is not shown:\n%s", args, r.out)
		}
	}
	r := berth(t, b, "dlq", "show", "billing", m.ID)
	if !strings.Contains(r.out, "line1\n\\x1b[31mred") {
		t.Errorf("body: newlines kept, escapes escaped:\n%s", r.out)
	}
	// -json: valid JSON that carries the text exactly; no raw ESC byte.
	r = berth(t, b, "-json", "dlq", "show", "billing", m.ID)
	var j dlq.Message
	if json.Unmarshal([]byte(r.out), &j) != nil || j.Headers["note"] != evil || strings.Contains(r.out, "\x1b") {
		t.Fatalf("json: %s", r.out)
	}
	if got := esc("a\xffb\tc"); got != `a\xffb\tc` {
		t.Errorf("esc = %q", got)
	}
}

func TestProgressOnATerminal(t *testing.T) {
	b, _ := deadLettered(t, 30)
	r := berthEnv(t, context.Background(), b, env{progress: true}, "dlq", "redrive", "billing", "-yes", "-page-size", "7")
	if r.code != 0 || !strings.Contains(r.err, "redrive billing") || !strings.Contains(r.err, "30/30") || r.out != "redriven 30 dead letter(s) of billing\n" {
		t.Fatalf("exit %d\nstdout %q\nstderr %q", r.code, r.out, r.err)
	}
}

func TestURLErrors(t *testing.T) {
	var out, errOut bytes.Buffer
	e := env{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, open: openURL}
	code := run(context.Background(), []string{"stats", "-url", "postgres://admin:hunter2@127.0.0.1:1/db?lease=soon"}, e)
	if code != exitUsage || !strings.Contains(errOut.String(), `parameter "lease"`) || strings.Contains(errOut.String(), "hunter2") {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	errOut.Reset()
	if code := run(context.Background(), []string{"stats"}, e); code != exitUsage || !strings.Contains(errOut.String(), "BERTH_URL") {
		t.Fatalf("no URL: exit %d %s", code, errOut.String())
	}
	errOut.Reset()
	e.getenv = func(k string) string {
		if k == "BERTH_URL" {
			return "mem://"
		}
		return ""
	}
	out.Reset()
	if code := run(context.Background(), []string{"stats", "-json"}, e); code != 0 || !strings.Contains(out.String(), `"queues":[]`) {
		t.Fatalf("BERTH_URL mem://: exit %d %s %s", code, out.String(), errOut.String())
	}
}

// -json carries message text exactly, but encoding/json writes C1 controls
// (U+009B is CSI to a terminal) and bidirectional-text controls as they are:
// printed to a terminal they act on it, or make text read as something it
// is not. They must reach stdout as \u escapes.
func TestJSONEscapesTerminalControls(t *testing.T) {
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const evil = "a\u202eevil\u2066\u009b31m\u0085\x7fz"
	m := &sdk.Message{Type: "billing." + evil, Body: []byte("body " + evil), Headers: map[string]string{"note": evil}}
	if err := b.Publish(ctx, "billing", m); err != nil {
		t.Fatal(err)
	}
	ds, _ := b.Receive(ctx, "billing", 1)
	if err := ds[0].DeadLetter(ctx, errors.New("bad input: "+evil)); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-json", "dlq", "list", "billing"},
		{"-json", "dlq", "show", "billing", m.ID},
		{"-json", "dlq", "redrive", "billing", "-dry-run"},
	} {
		r := berth(t, b, args...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d %s", args, r.code, r.err)
		}
		for _, raw := range []string{"\u202e", "\u2066", "\u009b", "\u0085", "\x7f"} {
			if strings.Contains(r.out, raw) {
				t.Errorf("%v printed %q raw: %q", args, raw, r.out)
			}
		}
		var v struct {
			Type     string `json:"type"`
			Headers  map[string]string
			Messages []dlq.Message `json:"messages"`
		}
		if err := json.Unmarshal([]byte(r.out), &v); err != nil {
			t.Fatalf("%v: not JSON: %v: %s", args, err, r.out)
		}
		if len(v.Messages) == 1 {
			v.Type, v.Headers = v.Messages[0].Type, v.Messages[0].Headers
		}
		if v.Type != m.Type || v.Headers["note"] != evil {
			t.Errorf("%v: the text is not carried exactly: type %q, note %q", args, v.Type, v.Headers["note"])
		}
	}
}

// countingReads counts the dead-letter reads of a memory broker.
type countingReads struct {
	*memory.Broker
	reads atomic.Int64
}

func (c *countingReads) Close() error { return nil }

func (c *countingReads) DeadLetterPage(ctx context.Context, queue, cursor string, limit int) ([]*sdk.Message, string, error) {
	c.reads.Add(1)
	return c.Broker.DeadLetterPage(ctx, queue, cursor, limit)
}

func (c *countingReads) DeadLetterMark(ctx context.Context, queue string) (string, error) {
	c.reads.Add(1)
	return c.Broker.DeadLetterMark(ctx, queue)
}

func (c *countingReads) DeadLetterPageTo(ctx context.Context, queue, cursor, mark string, limit int) ([]*sdk.Message, string, error) {
	c.reads.Add(1)
	return c.Broker.DeadLetterPageTo(ctx, queue, cursor, mark, limit)
}

func (c *countingReads) GetDeadLetter(ctx context.Context, queue, id string) (*sdk.Message, error) {
	c.reads.Add(1)
	return c.Broker.GetDeadLetter(ctx, queue, id)
}

func (c *countingReads) ListDeadLetters(ctx context.Context, queue string, limit int) ([]*sdk.Message, error) {
	c.reads.Add(1)
	return c.Broker.ListDeadLetters(ctx, queue, limit)
}

// A change that can never be confirmed (no -yes, no -dry-run, no terminal)
// is refused before it reads a dead letter: counting what it will not
// change is a scan of the whole dead-letter queue, which on RabbitMQ and
// SQS takes every letter and puts it back.
func TestRefusedChangeReadsNothing(t *testing.T) {
	b, ids := deadLettered(t, 5)
	cb := &countingReads{Broker: b}
	e := env{open: func(context.Context, string) (sdk.Broker, error) { return cb, nil }}
	for _, args := range [][]string{
		{"dlq", "purge", "billing"},
		{"dlq", "redrive", "billing", "-class", "permanent"},
		{"dlq", "purge", "billing", ids[0], ids[1]},
		{"dlq", "redrive", "billing", "-class", "nope"}, // would match nothing: still a usage error
	} {
		r := berthEnv(t, context.Background(), b, e, args...)
		if r.code != exitUsage || !strings.Contains(r.err, "without -yes") {
			t.Errorf("%v: exit %d %s", args, r.code, r.err)
		}
		if n := cb.reads.Swap(0); n != 0 {
			t.Errorf("%v: refused after %d dead-letter read(s)", args, n)
		}
	}
	if st := stats(t, b); st.DeadLettered != 5 {
		t.Fatalf("a refused change changed something: %+v", st)
	}
	// A dry run and a terminal still read.
	if r := berthEnv(t, context.Background(), b, e, "dlq", "purge", "billing", "-dry-run"); r.code != exitOK || cb.reads.Load() == 0 {
		t.Fatalf("dry run: exit %d, %d reads: %s", r.code, cb.reads.Load(), r.err)
	}
}

// The count before a confirmation, a dry run's and a filtered list's walk
// the whole dead-letter queue: on a terminal they show how far they got.
func TestScanProgressOnATerminal(t *testing.T) {
	b, _ := deadLettered(t, 30)
	e := env{progress: true, interactive: true, stdin: strings.NewReader("n\n")}
	r := berthEnv(t, context.Background(), b, e, "dlq", "purge", "billing", "-class", "permanent", "-page-size", "7")
	q := strings.Index(r.err, "delete 20 dead letter(s) of billing for good?")
	if q < 0 || !strings.Contains(r.err[:q], "counting billing") || !strings.Contains(r.err[:q], "(30/30") {
		t.Fatalf("before the question: exit %d, stderr %q", r.code, r.err)
	}
	for _, args := range [][]string{
		{"dlq", "redrive", "billing", "-reason", "timeout", "-dry-run", "-page-size", "7"},
		{"dlq", "list", "billing", "-reason", "timeout"},
	} {
		r := berthEnv(t, context.Background(), b, env{progress: true}, args...)
		if r.code != exitOK || !strings.Contains(r.err, "counting billing") || !strings.Contains(r.err, "(30/30") {
			t.Errorf("%v: exit %d, stderr %q", args, r.code, r.err)
		}
	}
	// Without a terminal, no progress: stderr stays clean for scripts.
	if r := berth(t, b, "dlq", "list", "billing", "-reason", "timeout"); r.err != "" {
		t.Errorf("progress without a terminal: %q", r.err)
	}
}

// lockedWriter is an io.Writer safe for concurrent use that counts writes.
type lockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Len()
}

// A scan that read nothing (an empty dead-letter queue) must not leave its
// progress line drawing after it ended: whatever the command prints next
// (a -watch refresh, a question) would be drawn over.
func TestScanProgressEndsWhenNothingWasRead(t *testing.T) {
	w := &lockedWriter{}
	c := &cli{env: env{stderr: w, progress: true}}
	o, stop := c.scanProgress(dlq.Options{}, "counting billing")
	o.Scanned(0)
	stop()
	n := w.Len()
	time.Sleep(350 * time.Millisecond) // the spinner redrew every 100ms
	if m := w.Len(); m != n {
		t.Fatalf("the progress line went on drawing after the scan ended: %d bytes more: %q", m-n, w.b.String()[n:])
	}
}
