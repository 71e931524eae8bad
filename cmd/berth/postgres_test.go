package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgSchema returns a pool, a migrated broker in a fresh schema and the
// broker URL of that schema for the CLI.
func pgSchema(t *testing.T, keep bool) (*pgxpool.Pool, *postgres.Broker, string) {
	t.Helper()
	ctx := context.Background()
	dsn := integration.PostgresDSN(t)
	schema := fmt.Sprintf("cli_test_%d", rand.Uint64()%1e12)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	b, err := postgres.New(pool, postgres.Options{Schema: schema, DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		if !keep {
			_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		}
		pool.Close()
	})
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
	return pool, b, u.String()
}

func cliOn(t *testing.T, rawURL string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append([]string{"-url", rawURL}, args...), env{
		stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, open: openURL,
	})
	return result{out.String(), errOut.String(), code}
}

// TestOnPostgres drives the CLI, through its real URL opener, against the
// PostgreSQL broker: a dead letter made by the broker is listed, shown,
// redriven to its queue and the queue's stats agree.
func TestOnPostgres(t *testing.T) {
	ctx := context.Background()
	_, b, u := pgSchema(t, false)
	m := &sdk.Message{Type: "billing.charge", Body: []byte(`{"order":"o9"}`)}
	if err := b.Publish(ctx, "billing", m); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "billing", 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive %d %v", len(ds), err)
	}
	if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("order o9 missing"))); err != nil {
		t.Fatal(err)
	}
	if r := cliOn(t, u, "dlq", "list", "billing"); r.code != 0 || !strings.Contains(r.out, m.ID) || !strings.Contains(r.out, "order o9 missing") {
		t.Fatalf("dlq list (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if r := cliOn(t, u, "dlq", "show", "billing", m.ID); r.code != 0 || !strings.Contains(r.out, `{"order":"o9"}`) {
		t.Fatalf("dlq show (exit %d):\n%s", r.code, r.out)
	}
	if r := cliOn(t, u, "dlq", "redrive", "billing", "-yes"); r.code != 0 || !strings.Contains(r.out, "redriven 1") {
		t.Fatalf("dlq redrive (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	r := cliOn(t, u, "-json", "stats")
	if r.code != 0 || !strings.Contains(r.out, `"queue":"billing","ready":1`) || !strings.Contains(r.out, `"dead_lettered":0`) {
		t.Fatalf("stats after redrive (exit %d):\n%s", r.code, r.out)
	}
	ds, err = b.Receive(ctx, "billing", 1)
	if err != nil || len(ds) != 1 || ds[0].Attempt() != 1 || ds[0].Message().ID != m.ID {
		t.Fatalf("redriven message: %v %v", ds, err)
	}
	_ = ds[0].Ack(ctx)
}

// seedDeadLetters publishes n messages to queue and turns them into dead
// letters in one statement, with the headers the broker's DeadLetter writes
// (the real path costs a round trip per message; TestOnPostgres covers it).
func seedDeadLetters(t testing.TB, pool *pgxpool.Pool, b *postgres.Broker, queue string, n int) {
	t.Helper()
	ctx := context.Background()
	for done := 0; done < n; {
		k := min(1000, n-done)
		msgs := make([]*sdk.Message, k)
		for i := range msgs {
			msgs[i] = &sdk.Message{Type: "billing.charge", Body: fmt.Appendf(nil, `{"n":%d,"pad":"%s"}`, done+i, strings.Repeat("x", 200))}
		}
		if err := b.Publish(ctx, queue, msgs...); err != nil {
			t.Fatal(err)
		}
		done += k
	}
	_, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{b.Schema(), "jobs"}.Sanitize()+` SET status = 'dead_letter', attempt_count = 5,
		updated_at = now() + id * interval '1 microsecond',
		headers = COALESCE(headers, '{}') || jsonb_build_object(
			'berth-dlq-reason', 'timeout ' || id, 'berth-dlq-class', 'transient', 'berth-dlq-attempts', '5',
			'berth-dlq-queue', queue, 'berth-first-failure', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
			'berth-last-failure', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))
		WHERE queue = $1 AND status = 'queued'`, queue)
	if err != nil {
		t.Fatal(err)
	}
}

// TestRedriveManyOnPostgres redrives 5,000 dead letters page by page
// (BERTH_REDRIVE_N sets another count; BENCHMARKS.md has the 100,000 run):
// every one is back on the queue, none is left, none is doubled.
func TestRedriveManyOnPostgres(t *testing.T) {
	n := 5000
	if s := os.Getenv("BERTH_REDRIVE_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	ctx := context.Background()
	pool, b, u := pgSchema(t, false)
	seedDeadLetters(t, pool, b, "billing", n)
	r := cliOn(t, u, "dlq", "redrive", "billing", "-yes", "-page-size", "700", "-json")
	if r.code != 0 || !strings.Contains(r.out, fmt.Sprintf(`"done":%d`, n)) {
		t.Fatalf("exit %d: %s %s", r.code, r.out, r.err)
	}
	var rows, distinct, queued, dead int
	err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id), count(*) FILTER (WHERE status = 'queued' AND attempt_count = 0),
		count(*) FILTER (WHERE status = 'dead_letter') FROM `+pgx.Identifier{b.Schema(), "jobs"}.Sanitize()).Scan(&rows, &distinct, &queued, &dead)
	if err != nil {
		t.Fatal(err)
	}
	if rows != n || distinct != n || queued != n || dead != 0 {
		t.Fatalf("%d rows, %d distinct, %d queued, %d dead; want %d, %d, %d, 0", rows, distinct, queued, dead, n, n, n)
	}
}

// TestSignalStopsARedrive sends SIGTERM to a berth process redriving 20,000
// dead letters on PostgreSQL: it exits 4 (partial) and what it reports done
// is exactly what moved — nothing lost, nothing doubled.
func TestSignalStopsARedrive(t *testing.T) {
	const n = 20000
	ctx := context.Background()
	pool, b, u := pgSchema(t, false)
	seedDeadLetters(t, pool, b, "billing", n)
	table := pgx.Identifier{b.Schema(), "jobs"}.Sanitize()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "BERTH_CLI_ARGS="+strings.Join([]string{"dlq", "redrive", "billing", "-yes", "-json", "-page-size", "200", "-url", u}, "\x1f"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	// A t.Fatal below, or the 60 s guard, must not leave berth redriving.
	child := integration.StartChild(t, cmd)
	for {
		var queued int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE status = 'queued'`).Scan(&queued); err != nil {
			t.Fatal(err)
		}
		if queued >= 1000 {
			break
		}
		select {
		case <-child.Done():
			t.Fatalf("berth exited before the signal: %v\n%s%s", child.Wait(), out.String(), errOut.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var code int
	select {
	case <-child.Done():
		var ee *exec.ExitError
		if errors.As(child.Wait(), &ee) {
			code = ee.ExitCode()
		}
	case <-time.After(60 * time.Second):
		t.Fatal("berth did not stop after SIGTERM")
	}
	var rep jsonChange
	if code != exitPartial || json.Unmarshal(out.Bytes(), &rep) != nil || !rep.Interrupted {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errOut.String())
	}
	var rows, distinct, queued, dead int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id), count(*) FILTER (WHERE status = 'queued'),
		count(*) FILTER (WHERE status = 'dead_letter') FROM `+table).Scan(&rows, &distinct, &queued, &dead); err != nil {
		t.Fatal(err)
	}
	if rep.Done == 0 || rep.Done == n || queued != rep.Done || dead != n-rep.Done || rows != n || distinct != n {
		t.Fatalf("reported %d done; table: %d rows, %d distinct, %d queued, %d dead", rep.Done, rows, distinct, queued, dead)
	}
	t.Logf("SIGTERM after %d of %d: exit 4, %d queued, %d still dead", rep.Done, n, queued, dead)
}
