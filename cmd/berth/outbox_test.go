package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// refusing is a publisher the broker side of which refuses everything.
type refusing struct{}

func (refusing) Publish(context.Context, string, ...*sdk.Message) error {
	return sdk.Permanent(errors.New("queue \x1b[31memails\x1b[0m does not exist"))
}

// parkedOutbox returns an outbox whose relay parked n rows, and its -db and
// -table.
func parkedOutbox(t *testing.T, n int) (*outbox.Outbox, string, string) {
	t.Helper()
	ctx := context.Background()
	dsn := integration.PostgresDSN(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("cli_outbox_%d", rand.Uint64()%1e12)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	box, err := outbox.New(pool, outbox.Options{Schema: schema, Table: "outbox"})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := box.Add(ctx, tx, "emails", &sdk.Message{Type: "email.receipt", Body: fmt.Appendf(nil, `{"order":%d}`, i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The relay reports the refusals and parks the rows (MaxAttempts 1).
	if _, err := box.RelayOnce(ctx, refusing{}, outbox.RelayOptions{MaxAttempts: 1}); err == nil {
		t.Fatal("the relay published to a refusing publisher")
	}
	return box, dsn, schema + ".outbox"
}

func cliDB(t *testing.T, stdin string, interactive bool, args ...string) result {
	t.Helper()
	var out, errOut strings.Builder
	code := run(context.Background(), args, env{
		stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, interactive: interactive,
		getenv: func(string) string { return "" }, open: openURL,
	})
	return result{out.String(), errOut.String(), code}
}

func TestOutboxParked(t *testing.T) {
	box, dsn, table := parkedOutbox(t, 3)
	ctx := context.Background()
	rows, err := box.Parked(ctx, 0)
	if err != nil || len(rows) != 3 {
		t.Fatalf("parked %d %v", len(rows), err)
	}
	r := cliDB(t, "", false, "outbox", "list", "-db", dsn, "-table", table)
	if r.code != 0 || !strings.Contains(r.out, "3 parked row(s)") || !strings.Contains(r.out, `\x1b[31memails`) || strings.Contains(r.out, "\x1b") {
		t.Fatalf("list: %d\n%s%s", r.code, r.out, r.err)
	}
	r = cliDB(t, "", false, "outbox", "list", "-db", dsn, "-table", table, "-json", "-limit", "1")
	var l jsonParkedList
	if r.code != 0 || json.Unmarshal([]byte(r.out), &l) != nil || l.Total != 3 || len(l.Rows) != 1 || l.Rows[0].Message.Type != "email.receipt" {
		t.Fatalf("list json: %d %s", r.code, r.out)
	}
	id := fmt.Sprint(rows[0].ID)
	// Without -yes and no terminal: refused; dry run: nothing changes.
	if r := cliDB(t, "", false, "outbox", "discard", id, "-db", dsn, "-table", table); r.code != exitUsage {
		t.Fatalf("discard without -yes: %d %s", r.code, r.err)
	}
	if r := cliDB(t, "", false, "outbox", "requeue", "-dry-run", "-db", dsn, "-table", table); r.code != 0 || !strings.Contains(r.out, "would requeue 3") {
		t.Fatalf("dry run: %d %s", r.code, r.out)
	}
	// An id that is not parked: 3, nothing changed.
	if r := cliDB(t, "", false, "outbox", "discard", id, "999999", "-yes", "-db", dsn, "-table", table); r.code != exitNotFound {
		t.Fatalf("unknown id: %d %s", r.code, r.err)
	}
	// A terminal's "y" discards one; -yes requeues the rest.
	if r := cliDB(t, "y\n", true, "outbox", "discard", id, "-db", dsn, "-table", table); r.code != 0 || !strings.Contains(r.err, "discard 1 parked row(s)") || !strings.Contains(r.out, "discarded 1") {
		t.Fatalf("discard: %d %s %s", r.code, r.out, r.err)
	}
	if r := cliDB(t, "", false, "outbox", "requeue", "-yes", "-db", dsn, "-table", table); r.code != 0 || !strings.Contains(r.out, "requeued 2") {
		t.Fatalf("requeue: %d %s %s", r.code, r.out, r.err)
	}
	pending, err := box.Pending(ctx)
	if rows, _ := box.Parked(ctx, 0); err != nil || pending != 2 || len(rows) != 0 {
		t.Fatalf("after: %d pending, %d parked, %v", pending, len(rows), err)
	}
	if r := cliDB(t, "", false, "outbox", "list", "-db", dsn, "-table", table); r.code != exitNotFound {
		t.Fatalf("empty list: %d", r.code)
	}
	if r := cliDB(t, "", false, "outbox", "list", "-db", dsn, "-table", "bad name.x"); r.code != exitUsage {
		t.Fatalf("bad table: %d %s", r.code, r.err)
	}
	if r := cliDB(t, "", false, "outbox", "list"); r.code != exitUsage || !strings.Contains(r.err, "BERTH_DB") {
		t.Fatalf("no -db: %d %s", r.code, r.err)
	}
}

// An outbox change that can never be confirmed (no -yes, no -dry-run, no
// terminal) is refused before the table is read, as a dead-letter change
// is: a usage error (2), whatever the rows it names or the table holds.
func TestOutboxRefusedChangeReadsNothing(t *testing.T) {
	box, dsn, table := parkedOutbox(t, 2)
	for _, args := range [][]string{
		{"outbox", "discard", "999999"}, // not parked: reading would say 3
		{"outbox", "requeue"},
		{"outbox", "discard"},
	} {
		r := cliDB(t, "", false, append(args, "-db", dsn, "-table", table)...)
		if r.code != exitUsage || !strings.Contains(r.err, "without -yes") {
			t.Errorf("%v: exit %d %s", args, r.code, r.err)
		}
	}
	if rows, err := box.Parked(context.Background(), 0); err != nil || len(rows) != 2 {
		t.Fatalf("a refused change changed something: %d parked, %v", len(rows), err)
	}
}

// TestOutboxListInfiniteTimes: `berth outbox list` lists every parked row
// when one has a created_at or parked_at of ±infinity (set by hand), and
// shows those times as "infinity" or "-infinity", in the table and in
// -json. Before, the whole list failed: pgx cannot scan an infinity into a
// time.Time.
func TestOutboxListInfiniteTimes(t *testing.T) {
	_, dsn, table := parkedOutbox(t, 3)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema, name, _ := strings.Cut(table, ".")
	if _, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{schema, name}.Sanitize()+` SET
created_at = CASE WHEN id = (SELECT min(id) FROM `+pgx.Identifier{schema, name}.Sanitize()+`) THEN '-infinity' ELSE created_at END,
parked_at = CASE WHEN id = (SELECT max(id) FROM `+pgx.Identifier{schema, name}.Sanitize()+`) THEN 'infinity' ELSE parked_at END`); err != nil {
		t.Fatal(err)
	}
	r := cliDB(t, "", false, "outbox", "list", "-db", dsn, "-table", table)
	if r.code != 0 || !strings.Contains(r.out, "3 parked row(s)") || strings.Count(r.out, " infinity ") != 1 {
		t.Fatalf("list with ±infinity times: %d\n%s%s", r.code, r.out, r.err)
	}
	r = cliDB(t, "", false, "outbox", "list", "-db", dsn, "-table", table, "-json")
	var l struct { // the documented shape: times are strings
		Total int `json:"total"`
		Rows  []struct {
			CreatedAt string `json:"created_at"`
			ParkedAt  string `json:"parked_at"`
		} `json:"rows"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.out), &l) != nil || l.Total != 3 || len(l.Rows) != 3 {
		t.Fatalf("list -json with ±infinity times: %d %s %s", r.code, r.out, r.err)
	}
	first, last := l.Rows[0], l.Rows[2]
	if first.CreatedAt != "-infinity" || last.ParkedAt != "infinity" {
		t.Errorf("created_at of the first row %q, parked_at of the last %q; want -infinity, infinity", first.CreatedAt, last.ParkedAt)
	}
	for _, at := range []string{first.ParkedAt, last.CreatedAt, l.Rows[1].CreatedAt, l.Rows[1].ParkedAt} {
		if _, err := time.Parse(time.RFC3339Nano, at); err != nil {
			t.Errorf("finite time %q: %v", at, err)
		}
	}
}
