package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
)

// partial publishes as RabbitMQ, SQS and JetStream do a batch they take in
// part: it prepares the messages in place (filling empty IDs, as every
// broker's Publish does), stores those not of type "bad", and reports the
// others in an *sdk.PublishError keyed by the IDs it prepared.
type partial struct{ b *memory.Broker }

func (p partial) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	if err := sdk.PrepareAll(ctx, q, msgs, 0); err != nil {
		return err
	}
	var ok []*sdk.Message
	failed := map[string]error{}
	for _, m := range msgs {
		if m.Type == "bad" {
			failed[m.ID] = errors.New("refused by the broker")
			continue
		}
		ok = append(ok, m)
	}
	if len(ok) > 0 {
		if err := p.b.Publish(ctx, q, ok...); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		return &sdk.PublishError{Failed: failed}
	}
	return nil
}

// TestRefusedRowWithoutIDIsKept: a row written into the table directly
// with an empty message_id, which the broker refuses in a batch it takes in
// part, stays in the outbox (one attempt counted) under an ID the relay gave
// it and keeps for its retry. Before, the broker filled an ID in its copy,
// the relay looked the row's outcome up under "", found none, took the row
// as published and deleted it: the message was lost.
func TestRefusedRowWithoutIDIsKept(t *testing.T) {
	ctx := context.Background()
	pool, box, b, schema := setupSchema(t, outbox.Options{})
	table := pgx.Identifier{schema, "berth_outbox"}.Sanitize()
	var rowID int64
	if err := pool.QueryRow(ctx, `INSERT INTO `+table+` (queue, message_id, job_type) VALUES ('q', '', 'bad') RETURNING id`).Scan(&rowID); err != nil {
		t.Fatal(err)
	}
	good := &sdk.Message{Type: "x"}
	add(t, pool, box, "q", good)

	if _, err := box.RelayOnce(ctx, partial{b}, outbox.RelayOptions{}); err == nil {
		t.Fatal("RelayOnce: nil error, want the refusal of the row without an ID")
	}
	if got := drain(t, b, "q", 1); got[good.ID] == nil {
		t.Fatalf("published %v, want the good row", got)
	}
	var id string
	var attempts int
	err := pool.QueryRow(ctx, `SELECT message_id, attempts FROM `+table+` WHERE id = $1`, rowID).Scan(&id, &attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		t.Fatal("the refused row without a message ID was deleted as if published: the message is lost")
	}
	if err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || id == "" {
		t.Fatalf("refused row: message_id %q, attempts %d; want an ID given by the relay and 1 attempt", id, attempts)
	}

	// Its retry carries the same ID.
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET available_at = now(), job_type = 'x' WHERE id = $1`, rowID); err != nil {
		t.Fatal(err)
	}
	if n, err := box.RelayOnce(ctx, partial{b}, outbox.RelayOptions{}); err != nil || n != 1 {
		t.Fatalf("retry: %d, %v; want 1, nil", n, err)
	}
	if got := drain(t, b, "q", 1); got[id] == nil {
		t.Fatalf("retry published %v, want the ID %q the row was given", got, id)
	}
}

// TestInfiniteCreatedAtDoesNotStallTheRelay: a row whose created_at was
// set to ±infinity by hand is published (with its whole Delay, or none)
// and the rows around it go on. Before, the remaining-delay arithmetic
// failed the read of the whole table ("cannot subtract infinite
// timestamps" on PostgreSQL before 17) on every pass, logged as an outage.
func TestInfiniteCreatedAtDoesNotStallTheRelay(t *testing.T) {
	ctx := context.Background()
	pool, box, b, schema := setupSchema(t, outbox.Options{})
	table := pgx.Identifier{schema, "berth_outbox"}.Sanitize()
	future := &sdk.Message{Type: "x", Delay: time.Hour}
	past := &sdk.Message{Type: "x", Delay: time.Hour}
	plain := &sdk.Message{Type: "x"}
	add(t, pool, box, "q", future, past, plain)
	for id, at := range map[string]string{future.ID: "infinity", past.ID: "-infinity"} {
		if _, err := pool.Exec(ctx, `UPDATE `+table+` SET created_at = $2::timestamptz WHERE message_id = $1`, id, at); err != nil {
			t.Fatal(err)
		}
	}
	pub := &delays{Publisher: b, got: map[string]time.Duration{}}
	if n, err := box.RelayOnce(ctx, pub, outbox.RelayOptions{}); err != nil || n != 3 {
		t.Fatalf("RelayOnce with ±infinity created_at rows: %d, %v; want 3, nil", n, err)
	}
	if d := pub.got[future.ID]; d != time.Hour {
		t.Errorf("created_at infinity: published with delay %s, want the whole 1h", d)
	}
	if d := pub.got[past.ID]; d != 0 {
		t.Errorf("created_at -infinity: published with delay %s, want none", d)
	}
}

// TestRelayErrorEscapesTheCause: the error of a pass holds each failed
// row's cause as the broker wrote it, and brokers quote the message ID
// (the memory broker's "message <ID> is N bytes"): that text is escaped
// too, and the cause still matches errors.Is. Before, only the relay's own
// "message <ID>" was escaped and the cause carried the raw ID.
func TestRelayErrorEscapesTheCause(t *testing.T) {
	ctx := context.Background()
	pool, box, _, _ := setupSchema(t, outbox.Options{})
	small, err := memory.New(memory.Options{MaxMessageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	m := &sdk.Message{ID: "id\x1b[2J\nforged", Type: "x", Body: make([]byte, 500)}
	add(t, pool, box, "q", m)
	_, err = box.RelayOnce(ctx, small, outbox.RelayOptions{})
	if !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Fatalf("RelayOnce: %v; want the broker's ErrMessageTooLarge", err)
	}
	if text := err.Error(); strings.ContainsAny(text, "\x1b\n") {
		t.Fatalf("error %q: the cause carries the message ID unescaped", text)
	}
}

// TestHugeDelayIsSetAside: a row written into the table directly with a
// delay_ms far beyond sdk.MaxDelay is set aside, whatever its size. Before,
// the relay made a time.Duration of it by multiplying the milliseconds,
// which wraps past int64 for delays of some 292 years or more: 18446744074709
// ms (about 584 years) became a delay of under a second and the row was
// published almost at once instead of being parked.
func TestHugeDelayIsSetAside(t *testing.T) {
	ctx := context.Background()
	pool, box, b, schema := setupSchema(t, outbox.Options{})
	table := pgx.Identifier{schema, "berth_outbox"}.Sanitize()
	const wraps = 18446744074709 // × 1e6 ns is 2^64 + 999448384 ns
	var rowID int64
	if err := pool.QueryRow(ctx, `INSERT INTO `+table+` (queue, message_id, job_type, delay_ms) VALUES ('q', 'huge-delay', 'x', $1) RETURNING id`,
		int64(wraps)).Scan(&rowID); err != nil {
		t.Fatal(err)
	}
	pub := &delays{Publisher: b, got: map[string]time.Duration{}}
	if _, err := box.RelayOnce(ctx, pub, outbox.RelayOptions{Logger: slog.New(&records{})}); err != nil {
		t.Fatalf("RelayOnce: %v", err)
	}
	if d, ok := pub.got["huge-delay"]; ok {
		t.Fatalf("a row with a delay of %d ms was published with delay %s; want it set aside", int64(wraps), d)
	}
	parked, err := box.Parked(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || parked[0].ID != rowID || !strings.HasPrefix(parked[0].LastError, "outbox: set aside") {
		t.Fatalf("parked %+v; want row %d set aside", parked, rowID)
	}
	if d := parked[0].Message.Delay; d <= sdk.MaxDelay {
		t.Errorf("Parked lists the row's delay as %s; want more than sdk.MaxDelay", d)
	}
}
