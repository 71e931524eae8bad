package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// jsonLookingBodies are bodies that json.Valid accepts but PostgreSQL text or
// jsonb cannot hold, and one it can, with whether payload_json gets a copy.
var jsonLookingBodies = []struct {
	name string
	body []byte
	copy bool
}{
	{"non-UTF-8 string", []byte(`{"a":"` + "\xff" + `"}`), false},
	{"non-UTF-8 key", []byte(`{"` + "\xfe" + `":1}`), false},
	{"NUL escape", []byte(`{"a":"\u0000"}`), false},
	{"lone surrogate", []byte(`["\ud800"]`), false},
	{"plain JSON", []byte(`{"a":"é","b":[1,2]}`), true},
}

// checkStored asserts that the job of message id holds body byte for byte and
// payload_json only when want says so.
func checkStored(t *testing.T, ctx context.Context, pool *pgxpool.Pool, b *postgres.Broker, id string, body []byte, want bool) {
	t.Helper()
	var payload []byte
	var copied bool
	if err := pool.QueryRow(ctx, `SELECT payload, payload_json IS NOT NULL FROM `+b.Schema()+`.jobs WHERE message_id = $1`, id).
		Scan(&payload, &copied); err != nil {
		t.Fatalf("row of %s: %v", id, err)
	}
	if !bytes.Equal(payload, body) || copied != want {
		t.Errorf("row of %s: payload %q (want %q), payload_json set %v (want %v)", id, payload, body, copied, want)
	}
}

// Issue 18 defect 1: a body that looks like JSON but is not UTF-8 (or holds
// what PostgreSQL's text and jsonb refuse) is published by Publish, PublishTx
// and the outbox relay, and arrives byte for byte; payload_json stays NULL.
func TestContract18_1_JSONLookingNonUTF8Body(t *testing.T) {
	pool := newPool(t, "berth-jsonbody-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{})
	ctx := testCtx(t)
	box, err := outbox.New(pool, outbox.Options{Schema: b.Schema(), Table: "outbox"})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, via := range []string{"Publish", "PublishTx", "outbox"} {
		for _, c := range jsonLookingBodies {
			q := "json_" + suffix()
			m := &sdk.Message{Type: "t", Body: append([]byte(nil), c.body...)}
			switch via {
			case "Publish":
				err = b.Publish(ctx, q, m)
			case "PublishTx", "outbox":
				tx, err2 := pool.Begin(ctx)
				if err2 != nil {
					t.Fatal(err2)
				}
				if via == "PublishTx" {
					err = b.PublishTx(ctx, tx, q, m)
				} else {
					err = box.Add(ctx, tx, q, m)
				}
				if err == nil {
					err = tx.Commit(ctx)
				} else {
					_ = tx.Rollback(ctx)
				}
				if err == nil && via == "outbox" {
					var n int
					n, err = box.RelayOnce(ctx, b, outbox.RelayOptions{})
					if err == nil && n != 1 {
						t.Errorf("%s %s: relayed %d rows, want 1", via, c.name, n)
					}
				}
			}
			if err != nil {
				t.Errorf("%s of a %s body: %v", via, c.name, err)
				continue
			}
			checkStored(t, ctx, pool, b, m.ID, c.body, c.copy)
			d := receiveN(t, b, q, 1)[0]
			if !bytes.Equal(d.Message().Body, c.body) {
				t.Errorf("%s %s: received %q, want %q", via, c.name, d.Message().Body, c.body)
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Issue 11 item 5: string fields that are not UTF-8 are refused with
// sdk.ErrInvalidMessage (not SQLSTATE 22021); a body that is not UTF-8
// round-trips; a Retry whose cause is long and not UTF-8 succeeds and stores
// a bounded, valid cause.
func TestHardening5_NonUTF8(t *testing.T) {
	pool := newPool(t, "berth-utf8-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{})
	ctx := testCtx(t)
	q := "utf8_" + suffix()
	for _, m := range []*sdk.Message{{Key: "order:\xfe"}, {IdempotencyKey: "k\xff"}, {Type: "\xc3"}, {ID: "id\xff"}, {CorrelationID: "\xfe"}} {
		if err := b.Publish(ctx, q, m); !errors.Is(err, sdk.ErrInvalidMessage) {
			t.Errorf("Publish of %+v: %v, want ErrInvalidMessage", m, err)
		}
	}
	body := []byte{0xff, 0xfe, 0x00, 'a'}
	m := &sdk.Message{Key: "order:1", Body: body}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatalf("Publish of a non-UTF-8 body: %v", err)
	}
	d := receiveN(t, b, q, 1)[0]
	if !bytes.Equal(d.Message().Body, body) {
		t.Errorf("body %x, want %x", d.Message().Body, body)
	}
	cause := errors.New(strings.Repeat("\xff bad \x00 bytes ", 1000))
	if err := d.Retry(ctx, 0, cause); err != nil {
		t.Fatalf("Retry with a non-UTF-8 cause: %v", err)
	}
	var lastErr string
	if err := pool.QueryRow(ctx, `SELECT last_error FROM `+b.Schema()+`.jobs WHERE message_id = $1`, m.ID).Scan(&lastErr); err != nil {
		t.Fatal(err)
	}
	if len(lastErr) > sdk.MaxReasonLength || !utf8.ValidString(lastErr) || strings.ContainsRune(lastErr, 0) || !strings.HasPrefix(lastErr, "\uFFFD bad") {
		t.Errorf("last_error is %d bytes %q, want at most %d valid UTF-8 bytes without NUL", len(lastErr), lastErr[:min(len(lastErr), 40)], sdk.MaxReasonLength)
	}
	d = receiveN(t, b, q, 1)[0]
	if d.Attempt() != 2 {
		t.Errorf("Attempt() after Retry = %d, want 2", d.Attempt())
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// Issue 11 item 2: a dead-letter row whose headers name another queue is
// redriven into its own queue (the row's queue column, which berth wrote),
// never into the queue the header names.
func TestHardening2_RedriveIgnoresForgedQueueHeader(t *testing.T) {
	pool := newPool(t, "berth-forged-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{})
	ctx := testCtx(t)
	q, victim := "orders_"+suffix(), "victim_"+suffix()
	// What a forged publish on older versions, or a hand-written row, leaves.
	if _, err := pool.Exec(ctx, `INSERT INTO `+b.Schema()+`.jobs (queue, message_id, payload, headers, status, attempt_count, max_attempts)
		VALUES ($1, 'forged-1', '\x00', jsonb_build_object($2::text, $3::text, $4::text, 'x'), 'dead_letter', 3, 5)`,
		q, sdk.HeaderDeadLetterQueue, victim, sdk.HeaderDeadLetterReason); err != nil {
		t.Fatal(err)
	}
	if n, err := b.RedriveDeadLetters(ctx, q); err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters = %d, %v; want 1, nil", n, err)
	}
	if s, err := b.Stats(ctx, victim); err == nil && s.Ready+s.Delayed != 0 {
		t.Errorf("the forged target %s got jobs: %+v", victim, s)
	}
	d := receiveN(t, b, q, 1)[0]
	if d.Message().ID != "forged-1" || d.Message().Header(sdk.HeaderDeadLetterQueue) != "" {
		t.Errorf("redriven %s with headers %v", d.Message().ID, d.Message().Headers)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, q, &sdk.Message{Headers: map[string]string{sdk.HeaderDeadLetterQueue: victim}}); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("Publish with a berth- header = %v, want ErrInvalidMessage", err)
	}
}

// Issue 11 item 6: the batched ack survives a pool whose connections were
// all terminated: it runs again on another connection (it is idempotent)
// instead of failing every ack of the batch, whose jobs would then wait out
// their lease and run again.
func TestHardening6_AckAfterTerminatedBackends(t *testing.T) {
	appName := "berth-ack-term-" + suffix()
	admin := newPool(t, "berth-ack-term-admin", 2)
	ctx := testCtx(t)
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	cfg.MaxConns, cfg.MinConns = n, 0
	// Never ping on acquire: the dead connections are handed out whatever
	// the machine's speed (pgxpool pings only those idle for over 1s).
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := newBroker(t, pool, postgres.Options{DisableListen: true, Schema: freshSchema(t, admin)})
	q := "ackterm_" + suffix()
	publishN(t, b, q, n)
	ds := receiveN(t, b, q, n)

	// All n connections open, then idle in the pool, then terminated.
	var held []*pgxpool.Conn
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	var killed int
	if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != n {
		t.Fatalf("terminated %d backends of %s, want %d", killed, appName, n)
	}
	for {
		var left int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	errs := make(chan error, n)
	for _, d := range ds {
		go func() { errs <- d.Ack(ctx) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("Ack after the pool's connections were terminated: %v", err)
		}
	}
	counts, err := b.CountByStatus(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if counts[postgres.StatusCompleted] != n {
		t.Errorf("jobs by status %v, want %d completed", counts, n)
	}
}
