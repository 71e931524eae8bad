package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// The berth-dlq-truncated marker says that berth shortened a dead letter's
// annotations; a new annotation and a redrive remove it (ARCHITECTURE.md,
// Reserved headers), on every broker. Go's DeadLetter does so through
// sdk.AnnotateDeadLetter and the other brokers' redrives through
// sdk.PrepareRedrive, but this broker's two SQL paths, the claim that
// dead-letters a job past max_attempts and the redrive, kept a marker
// another tool wrote on the row: its dead letter was listed as shortened,
// with its annotations whole, before and after a redrive.
func TestSQLPathsDropTheTruncatedMarker(t *testing.T) {
	pool := newPool(t, "berth-truncmark-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{MaxAttempts: 2, Lease: time.Minute, PollInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	q := "truncmark_" + suffix()
	const marked = `{"` + sdk.HeaderDeadLetterTruncated + `": "all", "app": "kept"}`
	// Past its attempts: the next claim dead-letters it.
	if _, err := pool.Exec(ctx, `INSERT INTO `+b.Schema()+`.jobs (queue, message_id, payload, headers, attempt_count, max_attempts)
		VALUES ($1, 'poison', '\x01', $2::jsonb, 2, 2)`, q, marked); err != nil {
		t.Fatal(err)
	}
	// A dead letter another tool wrote.
	if _, err := pool.Exec(ctx, `INSERT INTO `+b.Schema()+`.jobs (queue, message_id, payload, headers, status, max_attempts)
		VALUES ($1, 'dead', '\x01', $2::jsonb, 'dead_letter', 2)`, q, marked); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	ds, err := b.Receive(short, q, 10)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive of a job past max attempts: %d deliveries, %v; want none", len(ds), err)
	}
	m, err := b.GetDeadLetter(ctx, q, "poison")
	if err != nil {
		t.Fatal(err)
	}
	if m.Headers[sdk.HeaderDeadLetterTruncated] != "" || m.Header(sdk.HeaderDeadLetterReason) == "" || m.Header("app") != "kept" {
		t.Errorf("dead-lettered by the claim with headers %v: want its annotations, no %s", m.Headers, sdk.HeaderDeadLetterTruncated)
	}
	if n, err := b.RedriveDeadLetters(ctx, q); err != nil || n != 2 {
		t.Fatalf("RedriveDeadLetters = %d, %v; want 2", n, err)
	}
	for _, d := range receiveN(t, b, q, 2) {
		if v, ok := d.Message().Headers[sdk.HeaderDeadLetterTruncated]; ok || d.Message().Header("app") != "kept" {
			t.Errorf("%s redriven with headers %v (%s %q): want no %s", d.Message().ID, d.Message().Headers,
				sdk.HeaderDeadLetterTruncated, v, sdk.HeaderDeadLetterTruncated)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
