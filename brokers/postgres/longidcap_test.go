package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
)

// TestLongIDAtCapDoesNotStallQueue: a row at its attempt cap whose message
// ID is longer than the dead letters' index holds (written by hand, by
// another tool, or by a berth from before Publish bounded IDs) cannot be
// dead-lettered at claim. Before the fix the claim tried, failed with
// SQLSTATE 54000 (index row size exceeds the btree maximum), and so did
// every later claim of the queue: no job of it was delivered again. The
// row must be handed back, as one that cannot be decoded, and the other
// jobs delivered.
func TestLongIDAtCapDoesNotStallQueue(t *testing.T) {
	ctx := testCtx(t)
	pool := newPool(t, "berth-longidcap-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{PollInterval: 20 * time.Millisecond, DisableListen: true})
	q := "longidcap_" + suffix()
	var stuck int64
	// 6400 bytes of hex digits: too long for a btree entry even compressed.
	err := pool.QueryRow(ctx, `INSERT INTO `+b.Schema()+`.jobs (queue, message_id, payload, max_attempts, attempt_count, available_at)
		VALUES ($1, (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200)), '\x', 1, 1, now() - interval '1 hour')
		RETURNING id`, q).Scan(&stuck)
	if err != nil {
		t.Fatal(err)
	}
	ids := publishN(t, b, q, 1)

	ds, err := b.Receive(ctx, q, 10)
	if err != nil || len(ds) != 1 || ds[0].Message().ID != ids[0] {
		t.Fatalf("Receive: %d deliveries, %v; want the published job", len(ds), err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	var (
		status   string
		attempts int
	)
	if err := pool.QueryRow(ctx, `SELECT status, attempt_count FROM `+b.Schema()+`.jobs WHERE id = $1`, stuck).
		Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status == postgres.StatusProcessing || status == postgres.StatusDeadLetter || attempts != 1 {
		t.Fatalf("long-ID row after the claim: %s, %d attempts; want handed back, 1 attempt", status, attempts)
	}
	// Alone in the queue, it is reported with its job id, not a raw SQL error.
	_, err = b.Receive(ctx, q, 10)
	var de *postgres.DecodeError
	if !errors.As(err, &de) || len(de.JobIDs) != 1 || de.JobIDs[0] != stuck {
		t.Fatalf("Receive of the long-ID row alone: %v; want a DecodeError naming job %d", err, stuck)
	}
}

// TestLongIDAtCapThatFitsIsDeadLettered: the claim flagged every row at its
// cap whose message ID is over MaxIndexedLength (2048 bytes, Publish's
// bound) as one the dead letters' index cannot hold, and handed it back
// for ever, never dead-lettered. PostgreSQL compresses a long index entry
// and holds up to 2704 bytes: a 2500-byte ID, or a long one that
// compresses (both written by a berth from before Publish bounded IDs),
// was dead-lettered before and must still be.
func TestLongIDAtCapThatFitsIsDeadLettered(t *testing.T) {
	ctx := testCtx(t)
	pool := newPool(t, "berth-longidfits-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{PollInterval: 20 * time.Millisecond, DisableListen: true})
	q := "longidfits_" + suffix()
	var ids []int64
	for _, id := range []string{
		`(SELECT left(string_agg(md5(random()::text), ''), 2500) FROM generate_series(1, 80))`, // 2500 bytes, hardly compressible
		`repeat('a', 6000)`, // compresses to a few bytes
	} {
		var n int64
		if err := pool.QueryRow(ctx, `INSERT INTO `+b.Schema()+`.jobs (queue, message_id, payload, max_attempts, attempt_count, available_at)
			VALUES ($1, `+id+`, '\x', 1, 1, now() - interval '1 hour') RETURNING id`, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, n)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second) // nothing to deliver: Receive waits
	defer cancel()
	ds, err := b.Receive(rctx, q, 10)
	if (err != nil && !errors.Is(err, context.DeadlineExceeded)) || len(ds) != 0 {
		t.Fatalf("Receive: %d deliveries, %v; want none (both rows dead-lettered at claim)", len(ds), err)
	}
	for _, id := range ids {
		var status string
		if err := pool.QueryRow(ctx, `SELECT status FROM `+b.Schema()+`.jobs WHERE id = $1`, id).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status != postgres.StatusDeadLetter {
			t.Errorf("row %d at its cap, its ID fitting the index: %s; want dead-lettered", id, status)
		}
	}
}
