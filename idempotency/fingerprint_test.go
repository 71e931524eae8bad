package idempotency_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/sdk"
)

// TestFingerprintInjective: two different (job type, body) pairs never share
// a fingerprint, also when the job type holds a zero byte (memstore accepts
// such types): "a\x00b" with body "c" and "a" with body "b\x00c" hashed the
// same input, so a key reused for the other operation was taken for a
// duplicate and acked instead of refused as a conflict.
func TestFingerprintInjective(t *testing.T) {
	pairs := []struct {
		typ  string
		body string
	}{
		{"a\x00b", "c"}, {"a", "b\x00c"}, {"a\x00", "b"}, {"a", "\x00b"}, {"a\x00b\x00", ""}, {"a\x00b", "\x00"},
		{"a", "b"}, {"", "a\x00b"}, {"\x00", ""}, {"", "\x00"}, {"\x00", "\x00"}, {"\x00\x00", ""},
		{"3a", ""}, {"a\x00", ":"}, {"a\x00:", ""},
	}
	seen := map[string]int{}
	for i, p := range pairs {
		fp := idempotency.FingerprintOf(p.typ, []byte(p.body))
		if j, dup := seen[fp]; dup {
			t.Errorf("FingerprintOf(%q, %q) = FingerprintOf(%q, %q)", p.typ, p.body, pairs[j].typ, pairs[j].body)
		}
		seen[fp] = i
	}

	// Through the guard: the second operation is a conflict, not a duplicate.
	g, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{}), Mode: idempotency.Lease, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first := &sdk.Message{Type: "a\x00b", Body: []byte("c")}
	second := &sdk.Message{Type: "a", Body: []byte("b\x00c")}
	ran := 0
	for _, m := range []*sdk.Message{first, second} {
		op := idempotency.Operation{Key: "k", JobType: m.Type, Fingerprint: idempotency.Fingerprint(m)}
		_, err := g.Do(ctx, op, func(context.Context) error { ran++; return nil })
		if m == second && (!errors.Is(err, idempotency.ErrKeyConflict) || !sdk.IsPermanent(err)) {
			t.Errorf("key reused by another operation: Do = %v; want a permanent ErrKeyConflict", err)
		}
	}
	if ran != 1 {
		t.Errorf("operations ran %d times; want 1", ran)
	}
}

// TestFingerprintUnchanged: fingerprints are stored with their keys
// (pgstore, memstore, the redisstore cache), so those of job types without
// a zero byte stay the SHA-256 of type, zero byte, body: a changed
// fingerprint would make every key stored before an upgrade a conflict.
func TestFingerprintUnchanged(t *testing.T) {
	for _, p := range []struct{ typ, body string }{
		{"charge", `{"order":"o1"}`}, {"", ""}, {"t", "with\x00zero"}, {"ünïcode", "\xff\xfe"},
	} {
		sum := sha256.Sum256([]byte(p.typ + "\x00" + p.body))
		if got, want := idempotency.FingerprintOf(p.typ, []byte(p.body)), hex.EncodeToString(sum[:]); got != want {
			t.Errorf("FingerprintOf(%q, %q) = %s; want %s as before", p.typ, p.body, got, want)
		}
	}
	// A literal too, in case the computation above changed with it.
	if got, want := idempotency.FingerprintOf("charge", []byte(`{"order":"o1"}`)),
		"82c08041d8c36cb69c453fd49289e5936f82c5076e5bf3faa6174b5e36516474"; got != want {
		t.Errorf("FingerprintOf(charge) = %s; want %s as before", got, want)
	}
	// The other form is still 64 hex digits, as a store's column expects.
	if got := idempotency.FingerprintOf("a\x00b", []byte("c")); len(got) != 64 {
		t.Errorf("FingerprintOf of a type with a zero byte = %q; want 64 hex digits", got)
	}
}
