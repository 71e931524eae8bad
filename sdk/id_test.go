package sdk_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/berthq/berth/sdk"
)

// TestNewID checks that message IDs are UUIDv7 with the RFC variant, carry
// the current time, and increase strictly within the process, also when
// many are made in the same millisecond by several goroutines.
func TestNewID(t *testing.T) {
	before := time.Now().Add(-time.Millisecond)
	const goroutines, each = 4, 5000
	got := make([][]string, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for range each {
				got[g] = append(got[g], sdk.NewID())
			}
		})
	}
	wg.Wait()
	// Ties bump the 12-bit sequence, which carries into the milliseconds:
	// a burst of IDs runs ahead of the clock by up to one millisecond per
	// 4096 IDs (uuid.NewV7 does the same).
	after := time.Now().Add(time.Millisecond + goroutines*each/4096*time.Millisecond)
	seen := make(map[string]bool, goroutines*each)
	for _, ids := range got {
		for i, id := range ids {
			u, err := uuid.Parse(id)
			if err != nil {
				t.Fatalf("%q: %v", id, err)
			}
			if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
				t.Fatalf("%q: version %d variant %v, want 7 RFC4122", id, u.Version(), u.Variant())
			}
			if at := time.Unix(u.Time().UnixTime()); at.Before(before.Truncate(time.Millisecond)) || at.After(after) {
				t.Fatalf("%q: time %v outside [%v, %v]", id, at, before, after)
			}
			if i > 0 && id <= ids[i-1] {
				t.Fatalf("IDs not increasing: %q after %q", id, ids[i-1])
			}
			if seen[id] {
				t.Fatalf("duplicate ID %q", id)
			}
			seen[id] = true
		}
	}
}

// TestPrepareAllIDs checks the IDs PrepareAll gives a batch (one clock read
// for the whole batch): distinct, increasing in the batch's order and after
// an ID made just before, UUIDv7 carrying the current time; an ID the
// caller set is kept.
func TestPrepareAllIDs(t *testing.T) {
	before := time.Now().Add(-time.Millisecond)
	prev := sdk.NewID()
	msgs := make([]*sdk.Message, 10000)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "t"}
	}
	msgs[5].ID = "mine"
	if err := sdk.PrepareAll(context.Background(), "q", msgs, 0); err != nil {
		t.Fatal(err)
	}
	after := time.Now().Add(time.Millisecond + time.Duration(len(msgs)/4096)*time.Millisecond)
	if msgs[5].ID != "mine" {
		t.Fatalf("caller's ID replaced by %q", msgs[5].ID)
	}
	for i, m := range msgs {
		if i == 5 {
			continue
		}
		u, err := uuid.Parse(m.ID)
		if err != nil {
			t.Fatalf("message %d: %q: %v", i, m.ID, err)
		}
		if u.Version() != 7 || u.Variant() != uuid.RFC4122 || u.String() != m.ID {
			t.Fatalf("message %d: %q is version %d variant %v, canonical %q", i, m.ID, u.Version(), u.Variant(), u.String())
		}
		if m.CorrelationID != m.ID {
			t.Fatalf("message %d: correlation ID %q, want its own ID %q", i, m.CorrelationID, m.ID)
		}
		if at := time.Unix(u.Time().UnixTime()); at.Before(before.Truncate(time.Millisecond)) || at.After(after) {
			t.Fatalf("message %d: time %v outside [%v, %v]", i, at, before, after)
		}
		if m.ID <= prev {
			t.Fatalf("message %d: ID %q not after %q", i, m.ID, prev)
		}
		prev = m.ID
	}
}

// TestPrepareAllIDAllocations: the IDs of a batch are made 16 to an
// allocation, not one each, whatever mix of set and unset IDs it holds.
func TestPrepareAllIDAllocations(t *testing.T) {
	msgs := make([]*sdk.Message, 100)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "t"}
	}
	reset := func() {
		for i, m := range msgs {
			m.ID, m.CorrelationID = "", ""
			if i%10 == 3 {
				m.ID = "set by the caller"
			}
		}
	}
	allocs := testing.AllocsPerRun(50, func() {
		reset()
		if err := sdk.PrepareAll(context.Background(), "q", msgs, 0); err != nil {
			t.Fatal(err)
		}
	})
	// 90 IDs to make: ceil(90/16) = 6 allocations (AllocsPerRun counts the
	// whole process: 2 of slack for other goroutines; one each was 90).
	if allocs > 8 {
		t.Errorf("%.1f allocations for a batch of 90 new IDs, want at most 6", allocs)
	}
	seen := map[string]bool{}
	for i, m := range msgs {
		if i%10 == 3 {
			if m.ID != "set by the caller" {
				t.Fatalf("message %d: caller's ID replaced by %q", i, m.ID)
			}
			continue
		}
		if seen[m.ID] {
			t.Fatalf("message %d: duplicate ID %q", i, m.ID)
		}
		seen[m.ID] = true
	}
}

// BenchmarkPrepareAll prepares batches of 100 messages without IDs, as a
// broker's Publish does: reports ns and allocations per message.
func BenchmarkPrepareAll(b *testing.B) {
	msgs := make([]*sdk.Message, 100)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "bench", Body: []byte("{}")}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range msgs {
			m.ID, m.CorrelationID = "", ""
		}
		if err := sdk.PrepareAll(ctx, "q", msgs, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/msg")
}
