package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestOnPostgres drives the CLI, through its real opener, against the
// PostgreSQL broker: a dead letter made by the broker is listed, shown,
// redriven to its queue and the queue's stats agree.
func TestOnPostgres(t *testing.T) {
	ctx := context.Background()
	dsn := integration.PostgresDSN(t)
	schema := fmt.Sprintf("cli_test_%d", rand.Uint64()%1e12)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	b, err := postgres.New(pool, postgres.Options{Schema: schema, DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
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

	cli := func(args ...string) (string, int) {
		var out, errOut bytes.Buffer
		all := append([]string{"-broker", "postgres", "-url", dsn, "-schema", schema}, args...)
		code := run(ctx, all, &out, &errOut, open)
		if code != 0 {
			t.Logf("berth %v: %s", args, errOut.String())
		}
		return out.String(), code
	}
	if out, code := cli("dlq", "list", "billing"); code != 0 || !strings.Contains(out, m.ID) || !strings.Contains(out, "order o9 missing") {
		t.Fatalf("dlq list (exit %d):\n%s", code, out)
	}
	if out, code := cli("dlq", "show", "billing", m.ID); code != 0 || !strings.Contains(out, `{"order":"o9"}`) {
		t.Fatalf("dlq show (exit %d):\n%s", code, out)
	}
	if out, code := cli("dlq", "redrive", "billing"); code != 0 || !strings.Contains(out, "redriven 1") {
		t.Fatalf("dlq redrive (exit %d):\n%s", code, out)
	}
	out, code := cli("-json", "stats", "billing")
	if code != 0 || !strings.Contains(out, `"ready": 1`) || !strings.Contains(out, `"dead_lettered": 0`) {
		t.Fatalf("stats after redrive (exit %d):\n%s", code, out)
	}
	ds, err = b.Receive(ctx, "billing", 1)
	if err != nil || len(ds) != 1 || ds[0].Attempt() != 1 || ds[0].Message().ID != m.ID {
		t.Fatalf("redriven message: %v %v", ds, err)
	}
	_ = ds[0].Ack(ctx)
}
