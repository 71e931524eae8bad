package postgres_test

import (
	"testing"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestHandWrittenHeadersDoNotPoisonClaim: a hand-written row whose headers
// hold a JSON value that is not a string failed the whole claim after the
// UPDATE had committed, so every job claimed with it was left leased to
// nobody, an attempt spent; claimed together again at lease expiry, they
// were all dead-lettered "max deliveries exceeded" without ever running.
// Now the row is delivered (its non-string values as JSON text) with the
// others, and the dead-letter listing reads it too.
func TestHandWrittenHeadersDoNotPoisonClaim(t *testing.T) {
	pool := newPool(t, "berth-hdrs-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{})
	ctx := testCtx(t)
	q := "hdrs_" + suffix()
	if err := b.Publish(ctx, q, &sdk.Message{ID: "good-1", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+b.Schema()+`.jobs (queue, message_id, payload, headers, max_attempts)
		VALUES ($1, 'hand-1', '\x01', '{"retries": 3, "trace": "abc", "flags": [true]}', 5)`, q); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("Receive = %d deliveries, %v; want both jobs", len(ds), err)
	}
	for _, d := range ds {
		m := d.Message()
		if d.Attempt() != 1 {
			t.Errorf("%s: Attempt = %d, want 1", m.ID, d.Attempt())
		}
		if m.ID != "hand-1" {
			continue
		}
		want := map[string]string{"retries": "3", "trace": "abc", "flags": "[true]"}
		for k, v := range want {
			if m.Header(k) != v {
				t.Errorf("hand-written header %s = %q, want %q (all: %v)", k, m.Header(k), v, m.Headers)
			}
		}
		if err := d.DeadLetter(ctx, nil); err != nil {
			t.Fatalf("DeadLetter: %v", err)
		}
	}
	// A dead letter written by hand is listed too, not an error for them all.
	if _, err := pool.Exec(ctx, `INSERT INTO `+b.Schema()+`.jobs (queue, message_id, payload, headers, status, max_attempts)
		VALUES ($1, 'hand-2', '', '{"n": 1}', 'dead_letter', 5)`, q); err != nil {
		t.Fatal(err)
	}
	dead, err := b.ListDeadLetters(ctx, q, 10)
	if err != nil || len(dead) != 2 {
		t.Fatalf("ListDeadLetters = %d, %v; want both hand-written jobs", len(dead), err)
	}
	for _, m := range dead {
		if m.ID == "hand-1" && m.Header("trace") != "abc" || m.ID == "hand-2" && m.Header("n") != "1" {
			t.Errorf("dead letter %s headers %v", m.ID, m.Headers)
		}
	}
}
