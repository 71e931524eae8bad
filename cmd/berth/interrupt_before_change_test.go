package main

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/pause"
	"github.com/berthq/berth/sdk"
)

// cancelOnScan is a broker whose reads of the dead-letter queue stop as a
// Ctrl-C would: the run's context is cancelled, and the read fails with it.
type cancelOnScan struct {
	*memory.Broker
	cancel context.CancelFunc
}

func (c *cancelOnScan) Close() error { return nil }

func (c *cancelOnScan) DeadLetterPage(ctx context.Context, _, _ string, _ int) ([]*sdk.Message, string, error) {
	c.cancel()
	return nil, "", ctx.Err()
}

func (c *cancelOnScan) DeadLetterPageTo(ctx context.Context, _, _, _ string, _ int) ([]*sdk.Message, string, error) {
	c.cancel()
	return nil, "", ctx.Err()
}

// TestInterruptedBeforeAnyChange: a Ctrl-C (the run's context cancelled)
// while a change still reads (counting what to confirm, the first page of
// a -yes change, connecting) is reported as one at the y/N question is:
// exit 4, "interrupted", "nothing changed". It exited 1 with the bare
// "context canceled" of the read, which does not say whether anything was
// changed.
func TestInterruptedBeforeAnyChange(t *testing.T) {
	for _, args := range [][]string{
		{"dlq", "redrive", "billing"},                                // counting for the question
		{"dlq", "purge", "billing", "-class", "permanent"},           // counting for the question
		{"dlq", "redrive", "billing", "-class", "transient", "-yes"}, // the first page of the change
		{"dlq", "purge", "billing", "-type", "billing.charge", "-yes", "-json"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			b, _ := deadLettered(t, 4)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			scan := &cancelOnScan{Broker: b, cancel: cancel}
			r := berthEnv(t, ctx, b, env{interactive: true, open: func(context.Context, string) (sdk.Broker, error) { return scan, nil }}, args...)
			if r.code != exitPartial || !strings.Contains(r.err, "interrupted") || !strings.Contains(r.err, "nothing changed") {
				t.Errorf("exit %d, want %d (interrupted, nothing changed):\n%s%s", r.code, exitPartial, r.out, r.err)
			}
			if st := stats(t, b); st.DeadLettered != 4 || st.Ready != 1 {
				t.Errorf("after the interrupt: %+v, want the 4 dead letters and 1 ready untouched", st)
			}
		})
	}
}

// TestInterruptedBeforeAnyChangeOnPostgres: the outbox and queue changes
// interrupted before they changed anything (here: while connecting) say so
// too, exit 4.
func TestInterruptedBeforeAnyChangeOnPostgres(t *testing.T) {
	box, dsn, table := parkedOutbox(t, 2)
	_, schema := pgtest.Schema(t, 0)
	for _, args := range [][]string{
		{"outbox", "requeue", "-yes", "-db", dsn, "-table", table},
		{"outbox", "discard", "-db", dsn, "-table", table}, // on a terminal: counting for the question
		{"queue", "pause", "emails", "-db", dsn, "-schema", schema},
		{"queue", "resume", "emails", "-db", dsn, "-schema", schema},
	} {
		t.Run(strings.Join(args[:2], " "), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // the operator's Ctrl-C before the first answer
			var out, errOut strings.Builder
			code := run(ctx, args, env{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, interactive: true,
				getenv: func(string) string { return "" }, open: openURL})
			if code != exitPartial || !strings.Contains(errOut.String(), "interrupted") || !strings.Contains(errOut.String(), "nothing changed") {
				t.Errorf("exit %d, want %d (interrupted, nothing changed):\n%s%s", code, exitPartial, out.String(), errOut.String())
			}
		})
	}
	if rows, err := box.Parked(context.Background(), 0); err != nil || len(rows) != 2 {
		t.Errorf("parked after the interrupts: %d %v, want 2", len(rows), err)
	}
}

// cancelAfter is a stdout that cancels the run once it has printed want:
// the operator's Ctrl-C in the middle of a change.
type cancelAfter struct {
	mu     sync.Mutex
	buf    strings.Builder
	want   string
	cancel context.CancelFunc
}

func (w *cancelAfter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.cancel()
	}
	return n, err
}

// TestQueuePauseInterruptedPartWay: a Ctrl-C after the first of the queues
// was paused exits 4, says it was interrupted, and names what was done.
func TestQueuePauseInterruptedPartWay(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	pool, schema := pgtest.Schema(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &cancelAfter{want: "emails paused", cancel: cancel}
	var errOut strings.Builder
	code := run(ctx, []string{"queue", "pause", "emails", "reports", "-db", dsn, "-schema", schema}, env{stdin: strings.NewReader(""),
		stdout: out, stderr: &errOut, getenv: func(string) string { return "" }, open: openURL})
	if code != exitPartial || !strings.Contains(errOut.String(), "interrupted") || !strings.Contains(errOut.String(), "the 1 queue(s) before it were done") {
		t.Errorf("exit %d, want %d (interrupted, 1 done):\n%s%s", code, exitPartial, out.buf.String(), errOut.String())
	}
	s, err := pause.NewPG(pool, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if ps, err := s.Paused(context.Background()); err != nil || len(ps) != 1 || ps[0].Queue != "emails" {
		t.Errorf("paused: %+v %v, want emails only", ps, err)
	}
}
