package sdk

import (
	"math/rand/v2"
	"testing"

	"github.com/google/uuid"
)

// TestUUIDTextMatchesUUIDString checks the word-at-a-time hex of uuidText
// against github.com/google/uuid's String on every byte value in every
// position (each nibble above and below 10) and on random IDs.
func TestUUIDTextMatchesUUIDString(t *testing.T) {
	check := func(u [16]byte) {
		t.Helper()
		var text [36]byte
		uuidText(&text, &u)
		if got, want := string(text[:]), uuid.UUID(u).String(); got != want {
			t.Fatalf("uuidText(% x) = %s, want %s", u, got, want)
		}
	}
	for pos := range 16 {
		for v := range 256 {
			var u [16]byte
			u[pos] = byte(v)
			check(u)
			for i := range u {
				u[i] = ^u[i]
			}
			check(u)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		var u [16]byte
		for i := range u {
			u[i] = byte(r.Uint32())
		}
		check(u)
	}
}

// BenchmarkUUIDText is the cost of one ID's text.
func BenchmarkUUIDText(b *testing.B) {
	u := [16]byte{0x01, 0x93, 0xa4, 0xbc, 0xde, 0xf0, 0x7a, 0xbc, 0x9f, 0xed, 0xcb, 0xa9, 0x87, 0x65, 0x43, 0x21}
	var text [36]byte
	for b.Loop() {
		uuidText(&text, &u)
	}
}
