package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// TestJobShowSameKey: job show by idempotency key showed the newest job
// with the key and nothing else, so two publishes of one operation (the
// charge of RUNBOOK.md's "An order was charged twice", both succeeded)
// looked like one job; by ID, the other job of its key went unmentioned
// too. It now names the other jobs that share the shown job's key (-json:
// same_key_ids), on the ledger's tables and on the PostgreSQL broker's.
func TestJobShowSameKey(t *testing.T) {
	ctx := context.Background()
	dsn, schema, s := migratedLedger(t, "cli_samekey_")
	t0 := time.Now().Add(-time.Hour)
	ev := func(id, key string, sec int) ledger.Event {
		at := t0.Add(time.Duration(sec) * time.Second)
		return ledger.Event{MessageID: id, Queue: "billing", Type: "billing.charge", IdempotencyKey: key,
			Status: ledger.StatusSucceeded, Attempt: 1, At: at, StartedAt: at}
	}
	if err := s.Write(ctx, []ledger.Event{ev("charge-a", "charge:o1", 0), ev("charge-b\x1b[31m", "charge:o1", 10), ev("charge-c", "charge:o2", 20)}); err != nil {
		t.Fatal(err)
	}
	onLedger := func(args ...string) result {
		var out, errOut bytes.Buffer
		code := run(ctx, append([]string{"-db", dsn, "-schema", schema}, args...), env{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut,
			getenv: func(string) string { return "" }, open: openURL})
		return result{out.String(), errOut.String(), code}
	}
	sameKey := func(r result) []string {
		t.Helper()
		var v struct {
			ID         string   `json:"id"`
			SameKeyIDs []string `json:"same_key_ids"`
		}
		if err := json.Unmarshal([]byte(r.out), &v); err != nil || r.code != exitOK {
			t.Fatalf("job show -json: exit %d, %v\n%s%s", r.code, err, r.out, r.err)
		}
		return append([]string{v.ID}, v.SameKeyIDs...)
	}

	// By key: the newest, and the other one named.
	r := onLedger("job", "show", "charge:o1")
	if r.code != exitOK || !strings.Contains(r.out, `id:              charge-b\x1b[31m`) || !strings.Contains(r.out, "charge-a") || strings.Contains(r.out, "\x1b") {
		t.Errorf("job show by a shared key: exit %d\n%s%s", r.code, r.out, r.err)
	}
	if got := sameKey(onLedger("job", "show", "charge:o1", "-json")); fmt.Sprint(got) != fmt.Sprint([]string{"charge-b\x1b[31m", "charge-a"}) {
		t.Errorf("job show -json by a shared key: id and same_key_ids %q", got)
	}
	// By ID: the other job of its key named too.
	r = onLedger("job", "show", "charge-a")
	if r.code != exitOK || !strings.Contains(r.out, `charge-b\x1b[31m`) {
		t.Errorf("job show by the ID of a job whose key another has: exit %d\n%s%s", r.code, r.out, r.err)
	}
	// A key no other job has: nothing more said.
	if got := sameKey(onLedger("job", "show", "charge:o2", "-json")); fmt.Sprint(got) != "[charge-c]" {
		t.Errorf("job show -json of an unshared key: id and same_key_ids %q", got)
	}
	if r := onLedger("job", "show", "charge:o2"); r.code != exitOK || strings.Contains(r.out, "same idempotency key") {
		t.Errorf("job show of an unshared key: exit %d\n%s%s", r.code, r.out, r.err)
	}

	// The other jobs are a second read within its own bound: one that fails
	// (here its bound spent at once) is said, and the job is still shown.
	keep := sameKeyTimeout
	sameKeyTimeout = time.Nanosecond
	r = onLedger("job", "show", "charge-a")
	if r.code != exitOK || !strings.Contains(r.out, "id:              charge-a") || !strings.Contains(r.out, "same idempotency key: the other jobs were not read") {
		t.Errorf("job show with the same-key read failing: exit %d\n%s%s", r.code, r.out, r.err)
	}
	r = onLedger("job", "show", "charge-a", "-json")
	if r.code != exitOK || !strings.Contains(r.out, `"same_key_error"`) {
		t.Errorf("job show -json with the same-key read failing: exit %d\n%s%s", r.code, r.out, r.err)
	}
	sameKeyTimeout = keep
	// More than are named: the newest sameKeyMax, and "more".
	var bulk []ledger.Event
	for i := range sameKeyMax + 2 {
		bulk = append(bulk, ev(fmt.Sprintf("bulk-%02d", i), "bulk", 100+i))
	}
	if err := s.Write(ctx, bulk); err != nil {
		t.Fatal(err)
	}
	r = onLedger("job", "show", "bulk", "-json")
	var many struct {
		ID          string   `json:"id"`
		SameKeyIDs  []string `json:"same_key_ids"`
		SameKeyMore bool     `json:"same_key_more"`
	}
	if err := json.Unmarshal([]byte(r.out), &many); err != nil || many.ID != fmt.Sprintf("bulk-%02d", sameKeyMax+1) ||
		len(many.SameKeyIDs) != sameKeyMax || many.SameKeyIDs[0] != fmt.Sprintf("bulk-%02d", sameKeyMax) || !many.SameKeyMore {
		t.Errorf("job show -json of a key %d jobs share: %+v, %v\n%s%s", sameKeyMax+2, many, err, r.out, r.err)
	}
	if r := onLedger("job", "show", "bulk"); r.code != exitOK || !strings.Contains(r.out, "… and more") {
		t.Errorf("job show of a key %d jobs share: exit %d\n%s%s", sameKeyMax+2, r.code, r.out, r.err)
	}

	// The PostgreSQL broker's jobs table: two publishes with one key (no
	// publish dedupe), the newest shown, the other named.
	_, b, u := pgSchema(t, false)
	first := &sdk.Message{Type: "billing.charge", IdempotencyKey: "charge:o9", Body: []byte(`{}`)}
	if err := b.Publish(ctx, "billing", first); err != nil {
		t.Fatal(err)
	}
	second := &sdk.Message{Type: "billing.charge", IdempotencyKey: "charge:o9", Body: []byte(`{}`)}
	if err := b.Publish(ctx, "billing", second); err != nil {
		t.Fatal(err)
	}
	r = cliOn(t, u, "job", "show", "charge:o9", "-json")
	var v struct {
		ID         string   `json:"id"`
		SameKeyIDs []string `json:"same_key_ids"`
	}
	if err := json.Unmarshal([]byte(r.out), &v); err != nil || r.code != exitOK || v.ID != second.ID || fmt.Sprint(v.SameKeyIDs) != fmt.Sprint([]string{first.ID}) {
		t.Errorf("job show -json on the PostgreSQL broker: exit %d, %+v, want %s and [%s]\n%s%s", r.code, v, second.ID, first.ID, r.out, r.err)
	}
	if r := cliOn(t, u, "job", "show", "charge:o9"); r.code != exitOK || !strings.Contains(r.out, first.ID) {
		t.Errorf("job show on the PostgreSQL broker: exit %d\n%s%s", r.code, r.out, r.err)
	}
}

// migratedLedger returns the test database's DSN, a new schema (named prefix
// and a random number, dropped at the end of the test) and the ledger's
// tables migrated into it.
func migratedLedger(t *testing.T, prefix string) (string, string, *pgledger.Store) {
	t.Helper()
	ctx := context.Background()
	dsn := integration.PostgresDSN(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("%s%d", prefix, rand.Uint64()%1e12)
	t.Cleanup(func() { // after the test's defers: the pool must still be open to drop the schema
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	s, err := pgledger.New(pool, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return dsn, schema, s
}
