package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestNonObjectHeadersDeadLetterAndRedrive: a row whose headers are JSON but
// not an object — null (what a Go tool writes for a nil map), a string, a
// number, an array — written by hand or by another tool, is delivered with
// those headers dropped (parseHeaders); past max_attempts the claim
// dead-letters it with the dead-letter headers, and a redrive puts it back.
// The claim appended its headers to the row's with ||, which makes an array
// of a scalar or an array: the dead letter was listed without any of its
// dead-letter headers. And a redrive took them away with jsonb - text[],
// which fails on a scalar ("cannot delete from scalar"): one such dead
// letter failed the redrive of every dead letter of its queue.
func TestNonObjectHeadersDeadLetterAndRedrive(t *testing.T) {
	pool := newPool(t, "berth-nonobject-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{MaxAttempts: 2, Lease: time.Minute, PollInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	q := "nonobject_" + suffix()
	headers := []string{`null`, `"text"`, `42`, `[1, "a"]`}
	for i, h := range headers {
		// Past its attempts: the next claim dead-letters it.
		if _, err := pool.Exec(ctx, `INSERT INTO `+b.Schema()+`.jobs (queue, message_id, payload, headers, attempt_count, max_attempts)
			VALUES ($1, $2, '\x01', $3::jsonb, 2, 2)`, q, "poison-"+h, h); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		// A dead letter another tool wrote.
		if _, err := pool.Exec(ctx, `INSERT INTO `+b.Schema()+`.jobs (queue, message_id, payload, headers, status, max_attempts)
			VALUES ($1, $2, '\x01', $3::jsonb, 'dead_letter', 2)`, q, "dead-"+h, h); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	ds, err := b.Receive(short, q, 10)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive of jobs past max attempts: %d deliveries, %v; want none", len(ds), err)
	}
	for _, h := range headers {
		m, err := b.GetDeadLetter(ctx, q, "poison-"+h)
		if err != nil {
			t.Fatalf("headers %s: %v", h, err)
		}
		if m.Header(sdk.HeaderDeadLetterReason) == "" || m.Header(sdk.HeaderDeadLetterQueue) != q ||
			m.Header(sdk.HeaderDeadLetterAttempts) != "2" || m.Header(sdk.HeaderLastFailure) == "" {
			t.Errorf("headers %s: dead letter listed with headers %v; want the dead-letter headers", h, m.Headers)
		}
	}
	n, err := b.RedriveDeadLetters(ctx, q)
	if err != nil || n != 2*len(headers) {
		t.Fatalf("RedriveDeadLetters = %d, %v; want %d", n, err, 2*len(headers))
	}
	ds = receiveN(t, b, q, 2*len(headers))
	for _, d := range ds {
		if got := d.Message().Header(sdk.HeaderRedriveCount); got != "1" {
			t.Errorf("%s: redrive count %q, want 1 (headers %v)", d.Message().ID, got, d.Message().Headers)
		}
		if d.Message().Header(sdk.HeaderDeadLetterReason) != "" {
			t.Errorf("%s: redriven with the dead-letter headers %v", d.Message().ID, d.Message().Headers)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
