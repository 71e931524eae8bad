package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// outboxOf opens a second handle on the outbox table of parkedOutbox.
func outboxOf(t *testing.T, dsn, table string) (*outbox.Outbox, *pgxpool.Pool) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema, name, _ := strings.Cut(table, ".")
	box, err := outbox.New(pool, outbox.Options{Schema: schema, Table: name})
	if err != nil {
		t.Fatal(err)
	}
	return box, pool
}

// park adds n rows with bodies of size bytes and lets the relay park them.
func park(t *testing.T, box *outbox.Outbox, pool *pgxpool.Pool, n, size int) {
	t.Helper()
	ctx := context.Background()
	body := []byte(`{"pad":"` + strings.Repeat("x", size) + `"}`)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for range n {
		if err := box.Add(ctx, tx, "emails", &sdk.Message{Type: "email.receipt", Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_, _ = box.RelayOnce(ctx, refusing{}, outbox.RelayOptions{MaxAttempts: 1, BatchSize: n + 10})
}

// A dry run with -json prints the JSON document, not text.
func TestOutboxDryRunJSON(t *testing.T) {
	_, dsn, table := parkedOutbox(t, 2)
	r := cliDB(t, "", false, "outbox", "requeue", "-dry-run", "-json", "-db", dsn, "-table", table)
	var v map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.out), &v) != nil {
		t.Fatalf("exit %d, stdout %q: not JSON", r.code, r.out)
	}
	if v["action"] != "requeue" || v["dry_run"] != true || v["matched"] != 2.0 || v["done"] != 0.0 {
		t.Fatalf("dry run document %v", v)
	}
}

// An id named twice is one row: the dry run, the question and the change
// all count it once.
func TestOutboxDuplicateIDs(t *testing.T) {
	box, dsn, table := parkedOutbox(t, 2)
	rows, _ := box.Parked(context.Background(), 0)
	id := fmt.Sprint(rows[0].ID)
	dry := cliDB(t, "", false, "outbox", "discard", id, id, "-dry-run", "-db", dsn, "-table", table)
	if dry.code != 0 || !strings.Contains(dry.out, "would discard 1 ") {
		t.Fatalf("dry run: %d %q", dry.code, dry.out)
	}
	asked := cliDB(t, "y\n", true, "outbox", "discard", id, id, "-db", dsn, "-table", table)
	if asked.code != 0 || !strings.Contains(asked.err, "discard 1 parked row(s)") || !strings.Contains(asked.out, "discarded 1 ") {
		t.Fatalf("confirmed: %d %q %q", asked.code, asked.out, asked.err)
	}
	if left, _ := box.Parked(context.Background(), 0); len(left) != 1 || left[0].ID != rows[1].ID {
		t.Fatalf("left parked: %v", left)
	}
}

// parkWhileAsked parks one more outbox row when the operator's answer is read,
// as the relay does during an outage while the question is on screen.
type parkWhileAsked struct {
	box    *outbox.Outbox
	pool   *pgxpool.Pool
	t      *testing.T
	answer io.Reader
	done   bool
}

func (p *parkWhileAsked) Read(b []byte) (int, error) {
	if !p.done {
		p.done = true
		park(p.t, p.box, p.pool, 1, 10)
	}
	return p.answer.Read(b)
}

// "outbox discard|requeue" of all changes only the rows the operator
// confirmed, not those parked while the question was on screen.
func TestOutboxChangesOnlyTheConfirmed(t *testing.T) {
	for _, verb := range []string{"discard", "requeue"} {
		t.Run(verb, func(t *testing.T) {
			_, dsn, table := parkedOutbox(t, 1)
			box, pool := outboxOf(t, dsn, table)
			var out, errOut strings.Builder
			code := run(context.Background(), []string{"outbox", verb, "-db", dsn, "-table", table}, env{
				stdin: &parkWhileAsked{box: box, pool: pool, t: t, answer: strings.NewReader("y\n")}, stdout: &out, stderr: &errOut,
				interactive: true, getenv: func(string) string { return "" }, open: openURL,
			})
			if code != 0 || !strings.Contains(errOut.String(), verb+" 1 parked row(s)") || !strings.Contains(out.String(), "d 1 parked row(s)") {
				t.Fatalf("exit %d\nstdout %q\nstderr %q", code, out.String(), errOut.String())
			}
			if left, err := box.Parked(context.Background(), 0); err != nil || len(left) != 1 || string(left[0].Message.Body) != `{"pad":"xxxxxxxxxx"}` {
				t.Fatalf("the row parked during the question: %v %v", left, err)
			}
		})
	}
}

// onAnswer runs do once, when the operator's answer is first read: what
// happens while the question is on screen.
type onAnswer struct {
	do     func()
	answer io.Reader
	done   bool
}

func (p *onAnswer) Read(b []byte) (int, error) {
	if !p.done {
		p.done = true
		p.do()
	}
	return p.answer.Read(b)
}

// lowRequeued parks two rows and puts the lower back in line, as an
// operator's earlier requeue does: it is not parked at the next count.
func lowRequeued(t *testing.T) (box *outbox.Outbox, dsn, table string, low, counted int64) {
	t.Helper()
	box, dsn, table = parkedOutbox(t, 2)
	rows, err := box.Parked(context.Background(), 0)
	if err != nil || len(rows) != 2 {
		t.Fatalf("parked: %v %v", rows, err)
	}
	if _, err := box.Requeue(context.Background(), rows[0].ID); err != nil {
		t.Fatal(err)
	}
	return box, dsn, table, rows[0].ID, rows[1].ID
}

// changeAsked runs "outbox VERB" of all on a terminal, answering y, with
// meanwhile run while the question is on screen.
func changeAsked(t *testing.T, verb, dsn, table string, meanwhile func()) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut strings.Builder
	code = run(context.Background(), []string{"outbox", verb, "-db", dsn, "-table", table}, env{
		stdin: &onAnswer{do: meanwhile, answer: strings.NewReader("y\n")}, stdout: &out, stderr: &errOut,
		interactive: true, getenv: func(string) string { return "" }, open: openURL,
	})
	return code, out.String(), errOut.String()
}

// parkedIDs returns the ids of the parked rows.
func parkedIDs(t *testing.T, box *outbox.Outbox) []int64 {
	t.Helper()
	left, err := box.Parked(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := []int64{}
	for _, r := range left {
		ids = append(ids, r.ID)
	}
	return ids
}

// "outbox discard|requeue" of all leaves alone a row parked while the
// question was on screen also when its id is lower than those counted (rows
// are parked long after they were added). Before, the id ceiling let it
// through, and it was discarded (its message never published) in place of
// a counted row, which stayed parked.
func TestOutboxLeavesLowerRowParkedDuringQuestion(t *testing.T) {
	for _, verb := range []string{"discard", "requeue"} {
		t.Run(verb, func(t *testing.T) {
			box, dsn, table, low, counted := lowRequeued(t)
			code, out, errOut := changeAsked(t, verb, dsn, table, func() {
				// A relay pass refuses the requeued row again and parks it.
				_, _ = box.RelayOnce(context.Background(), refusing{}, outbox.RelayOptions{MaxAttempts: 1})
			})
			if code != 0 || !strings.Contains(errOut, verb+" 1 parked row(s)") || !strings.Contains(out, "d 1 parked row(s)") {
				t.Fatalf("exit %d\nstdout %q\nstderr %q", code, out, errOut)
			}
			if ids := parkedIDs(t, box); len(ids) != 1 || ids[0] != low {
				t.Fatalf("parked after the change: %v; want only row %d (parked during the question), not %d (counted and confirmed)", ids, low, counted)
			}
		})
	}
}

// "outbox requeue -yes" of all works in batches and changes every row.
func TestOutboxChangeAllInBatches(t *testing.T) {
	_, dsn, table := parkedOutbox(t, 1)
	box, pool := outboxOf(t, dsn, table)
	const total = 2345             // more than two batches
	park(t, box, pool, total-1, 1) // and parkedOutbox's
	r := cliDB(t, "", false, "outbox", "requeue", "-dry-run", "-db", dsn, "-table", table)
	if !strings.Contains(r.out, fmt.Sprintf("would requeue %d ", total)) {
		t.Fatalf("dry run: %d %s", r.code, r.out)
	}
	r = cliDB(t, "y\n", true, "outbox", "requeue", "-json", "-db", dsn, "-table", table)
	var v map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.out), &v) != nil || v["done"] != float64(total) {
		t.Fatalf("requeue: %d %s %s", r.code, r.out, r.err)
	}
	if rows, _ := box.Parked(context.Background(), 10); len(rows) != 0 {
		t.Fatalf("still parked: %d", len(rows))
	}
	if n, _ := box.Pending(context.Background()); n != total {
		t.Fatalf("pending %d", n)
	}
}

// "outbox list" and the dry run read the rows they show, not every parked
// row and body: memory stays bounded.
func TestOutboxBoundedMemory(t *testing.T) {
	_, dsn, table := parkedOutbox(t, 1)
	box, pool := outboxOf(t, dsn, table)
	park(t, box, pool, 250, 200<<10) // 250 × 200 KiB = 50 MiB parked
	for _, args := range [][]string{
		{"outbox", "list", "-limit", "1"},
		{"outbox", "discard", "-dry-run"},
		{"outbox", "requeue", "-dry-run", "-json"},
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		r := cliDB(t, "", false, append(args, "-db", dsn, "-table", table)...)
		runtime.ReadMemStats(&after)
		alloc := after.TotalAlloc - before.TotalAlloc
		if r.code != 0 || !strings.Contains(r.out, "251") {
			t.Fatalf("%v: exit %d %q %q", args, r.code, r.out, r.err)
		}
		if alloc > 20<<20 {
			t.Errorf("%v allocated %d MiB: it reads every parked row and body", args, alloc>>20)
		}
	}
}

// An outbox discard of all that stops part-way (an error, or an interrupt
// between batches) reports the rows it discarded before, and exits 4.
func TestOutboxChangeStoppedPartWay(t *testing.T) {
	for _, stop := range []string{"error", "interrupt"} {
		t.Run(stop, func(t *testing.T) {
			_, dsn, table := parkedOutbox(t, 1)
			box, pool := outboxOf(t, dsn, table)
			park(t, box, pool, 1099, 1)
			rows, err := box.Parked(context.Background(), 0)
			if err != nil || len(rows) != 1100 {
				t.Fatalf("parked %d %v", len(rows), err)
			}
			// A trigger fails the delete of the last row (the second batch),
			// or slows the first batch down while the operator interrupts.
			schema, _, _ := strings.Cut(table, ".")
			body := fmt.Sprintf(`IF OLD.id = %d THEN RAISE EXCEPTION 'disk full'; END IF;`, rows[1099].ID)
			if stop == "interrupt" {
				body = fmt.Sprintf(`IF OLD.id = %d THEN PERFORM pg_sleep(1); END IF;`, rows[0].ID)
			}
			for _, q := range []string{
				`CREATE FUNCTION ` + schema + `.stop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN ` + body + ` RETURN OLD; END $$`,
				`CREATE TRIGGER stop BEFORE DELETE ON ` + table + ` FOR EACH ROW EXECUTE FUNCTION ` + schema + `.stop()`,
			} {
				if _, err := pool.Exec(context.Background(), q); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if stop == "interrupt" { // the operator's ^C while the first batch runs
				go func() {
					for range 3000 {
						var n int
						_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE $1`,
							"DELETE FROM "+pgx.Identifier{schema, "outbox"}.Sanitize()+"%").Scan(&n)
						if n > 0 {
							break
						}
						time.Sleep(10 * time.Millisecond)
					}
					cancel()
				}()
			}
			var out, errOut strings.Builder
			code := run(ctx, []string{"outbox", "discard", "-yes", "-json", "-db", dsn, "-table", table}, env{
				stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, open: openURL,
			})
			left, _ := box.Parked(context.Background(), 0)
			var v struct {
				Done        int    `json:"done"`
				Interrupted bool   `json:"interrupted"`
				Error       string `json:"error"`
			}
			if err := json.Unmarshal([]byte(out.String()), &v); err != nil {
				t.Fatalf("exit %d, stdout %q (not the JSON document), stderr %q; %d rows left", code, out.String(), errOut.String(), len(left))
			}
			if code != exitPartial || v.Done != 1000 || len(left) != 100 {
				t.Fatalf("exit %d, %+v, %d rows left; stderr %q", code, v, len(left), errOut.String())
			}
			if stop == "error" && (!strings.Contains(v.Error, "disk full") || !strings.Contains(errOut.String(), "1000 parked row(s) were discarded, then: ")) {
				t.Fatalf("error: %+v, stderr %q", v, errOut.String())
			}
			if stop == "interrupt" && (!v.Interrupted || !strings.Contains(errOut.String(), "interrupted")) {
				t.Fatalf("interrupt: %+v, stderr %q", v, errOut.String())
			}
		})
	}
}

// TestOutboxListNegativeLimit: -limit is a page size; a negative one is a
// usage error (exit 2), as on "dlq list" and "jobs". "outbox list" took it
// for "no limit" and read and printed every parked row, however many.
func TestOutboxListNegativeLimit(t *testing.T) {
	_, dsn, table := parkedOutbox(t, 3)
	r := cliDB(t, "", false, "outbox", "list", "-db", dsn, "-table", table, "-limit", "-1")
	if r.code != exitUsage || !strings.Contains(r.err, "-limit") || strings.Contains(r.out, "emails") {
		t.Fatalf("outbox list -limit -1: exit %d\nstdout: %s\nstderr: %s", r.code, r.out, r.err)
	}
}

// "outbox discard|requeue" of all changes nothing when a row parked before
// the count (by a relay pass, which parks the rows it sets aside inside its
// transaction and commits after its publish) shows up after it: the row is
// parked before the database time the change pages by, so it would be
// changed in place of a counted row. Before, it was: the row the operator
// confirmed stayed parked, one never counted was discarded, exit 0.
func TestOutboxChangeRefusesRowParkedBeforeCountCommittedAfter(t *testing.T) {
	for _, verb := range []string{"discard", "requeue"} {
		t.Run(verb, func(t *testing.T) {
			ctx := context.Background()
			box, dsn, table, low, counted := lowRequeued(t)
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
			schema, name, _ := strings.Cut(table, ".")
			// What a relay pass does to a row it sets aside, before it
			// publishes the rest of its batch and commits.
			if _, err := tx.Exec(ctx, `UPDATE `+pgx.Identifier{schema, name}.Sanitize()+` SET parked_at = clock_timestamp(), last_error = 'set aside' WHERE id = $1`, low); err != nil {
				t.Fatal(err)
			}
			code, out, errOut := changeAsked(t, verb, dsn, table, func() { _ = tx.Commit(ctx) })
			if code == 0 || !strings.Contains(errOut, verb+" 1 parked row(s)") || !strings.Contains(errOut, "nothing changed") {
				t.Errorf("exit %d\nstdout %q\nstderr %q; want a refusal that changed nothing", code, out, errOut)
			}
			if ids := parkedIDs(t, box); len(ids) != 2 || ids[0] != low || ids[1] != counted {
				t.Fatalf("parked after the change: %v; want both %d and %d untouched", ids, low, counted)
			}
		})
	}
}
