package postgres_test

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// randomText returns n bytes of incompressible text (PostgreSQL compresses
// a repetitive value, which would then fit an index row).
func randomText(n int) string {
	p := make([]byte, n)
	_, _ = rand.Read(p)
	return base64.RawURLEncoding.EncodeToString(p)[:n]
}

// TestLongIDAndKeyRefusedAtPublish: an ID or IdempotencyKey over
// MaxIndexedLength is refused by Publish with ErrInvalidMessage, nothing of
// the batch inserted. Before, a 4000-byte ID was accepted and its job could
// never be dead-lettered (index row size exceeds btree maximum 2704, for
// jobs_dead_letter_idx: DeadLetter failed, and the claim dead-lettering it
// at the attempt cap failed with it), and a 4000-byte key with
// DedupeEnqueue failed its batch with that raw database error. IDs and keys
// at the bound work through publish, dedupe and dead-lettering.
func TestLongIDAndKeyRefusedAtPublish(t *testing.T) {
	pool := newPool(t, "longid", 4)
	b := newBroker(t, pool, postgres.Options{DedupeEnqueue: true})
	ctx := testCtx(t)
	for name, m := range map[string]*sdk.Message{
		"ID":             {ID: randomText(postgres.MaxIndexedLength + 1), Type: "t", Body: []byte("{}")},
		"IdempotencyKey": {Type: "t", IdempotencyKey: randomText(postgres.MaxIndexedLength + 1), Body: []byte("{}")},
		"4000-byte ID":   {ID: randomText(4000), Type: "t", Body: []byte("{}")},
		"4000-byte key":  {Type: "t", IdempotencyKey: randomText(4000), Body: []byte("{}")},
	} {
		ok := &sdk.Message{Type: "t", Body: []byte("{}")}
		err := b.Publish(ctx, "longid", ok, m)
		if !errors.Is(err, sdk.ErrInvalidMessage) || strings.Contains(err.Error(), "SQLSTATE") {
			t.Fatalf("%s over the bound: Publish = %v, want ErrInvalidMessage", name, err)
		}
	}
	if s, err := b.Stats(ctx, "longid"); err == nil && s.Ready != 0 {
		t.Fatalf("a refused batch inserted %d job(s)", s.Ready)
	}
	m := &sdk.Message{ID: randomText(postgres.MaxIndexedLength), IdempotencyKey: randomText(postgres.MaxIndexedLength), Type: "t", Body: []byte("{}")}
	if err := b.Publish(ctx, "longid", m); err != nil {
		t.Fatalf("Publish at the bound: %v", err)
	}
	dup := &sdk.Message{IdempotencyKey: m.IdempotencyKey, Type: "t", Body: []byte("{}")}
	if err := b.Publish(ctx, "longid", dup); err != nil || dup.ID != m.ID {
		t.Fatalf("dedupe at the bound: %v, ID %.20s…, want %.20s…", err, dup.ID, m.ID)
	}
	ds, err := b.Receive(ctx, "longid", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds[0].DeadLetter(ctx, errors.New("no")); err != nil {
		t.Fatalf("DeadLetter of a job whose ID is at the bound: %v", err)
	}
	if _, err := b.GetDeadLetter(ctx, "longid", m.ID); err != nil {
		t.Fatalf("GetDeadLetter: %v", err)
	}
}
