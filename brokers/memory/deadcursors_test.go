package memory_test

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// TestDeadLetterCursorsBounded: listings that stop midway (an operator's
// first page, a dashboard left open) keep nothing: the cursor map holds one
// entry per dead letter, however many partial walks were made, and no more
// once letters leave.
func TestDeadLetterCursorsBounded(t *testing.T) {
	ctx := ctxT(t)
	b, _ := memory.New(memory.Options{})
	defer b.Close()
	const letters = 1000
	for i := range letters {
		memory.PlantDeadLetter(b, "q", &sdk.Message{ID: "d" + strconv.Itoa(i)})
	}
	mark, err := b.DeadLetterMark(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10000 {
		cursor := ""
		if i%2 == 1 {
			cursor = strconv.Itoa(i % (letters - 10))
		}
		page, next, err := b.DeadLetterPage(ctx, "q", cursor, 3)
		if err != nil || len(page) == 0 || next == "" {
			t.Fatalf("partial page %d: %d letters, next %q, %v", i, len(page), next, err)
		}
		if _, _, err := b.DeadLetterPageTo(ctx, "q", next, mark, 2); err != nil { // and stop there
			t.Fatal(err)
		}
	}
	if n := memory.DeadLetterCursors(b, "q"); n != letters {
		t.Fatalf("cursor map holds %d entries after 10000 partial listings of %d letters, want %d", n, letters, letters)
	}
	if _, err := b.DeleteDeadLetters(ctx, "q", "d1", "d2", "d3"); err != nil {
		t.Fatal(err)
	}
	if n := memory.DeadLetterCursors(b, "q"); n != letters-3 {
		t.Fatalf("cursor map holds %d entries after 3 of %d letters were deleted, want %d", n, letters, letters-3)
	}
}

// TestDeadLettersReleasedWhenMostLeave: once all but a few letters of a
// burst are deleted or redriven by id, the dead-letter list and its cursor
// map must not keep their burst-sized memory (a Go map never shrinks; they
// were let go only once the list was empty, so a few letters left for an
// operator to look at kept the whole burst's).
func TestDeadLettersReleasedWhenMostLeave(t *testing.T) {
	ctx := ctxT(t)
	const burst, left = 50000, 10
	for _, redrive := range []bool{false, true} {
		t.Run(fmt.Sprintf("redrive=%v", redrive), func(t *testing.T) {
			b, _ := memory.New(memory.Options{})
			defer b.Close()
			if err := b.DeclareQueue(ctx, "q"); err != nil {
				t.Fatal(err)
			}
			ids := make([]string, burst)
			for i := range ids {
				ids[i] = strconv.Itoa(i)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var m sdk.Message
			for _, id := range ids {
				m.ID = id
				memory.PlantDeadLetter(b, "q", &m)
			}
			gone := ids[:burst-left] // the oldest go, the newest stay
			var err error
			if redrive {
				_, err = b.RedriveDeadLetters(ctx, "q", gone...)
				for n := 0; err == nil && n < len(gone); { // take and ack them all
					var ds []sdk.Delivery
					ds, err = b.Receive(ctx, "q", burst)
					for _, d := range ds {
						_ = d.Ack(ctx)
					}
					n += len(ds)
				}
			} else {
				_, err = b.DeleteDeadLetters(ctx, "q", gone...)
			}
			if err != nil {
				t.Fatal(err)
			}
			if n := memory.DeadLetterCursors(b, "q"); n != left {
				t.Fatalf("cursor map holds %d entries with %d letters left", n, left)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			kept := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			if limit := int64(burst) * 5; kept > limit {
				t.Errorf("%d bytes kept with %d of %d dead letters left, want at most %d", kept, left, burst, limit)
			}
			// The letters left still page and redrive by their positions.
			page, next, err := b.DeadLetterPage(ctx, "q", "", 100)
			if err != nil || len(page) != left || next != "" || page[0].ID != ids[burst-left] {
				t.Fatalf("page of the letters left: %d, next %q, %v", len(page), next, err)
			}
			runtime.KeepAlive(b)
			runtime.KeepAlive(ids)
		})
	}
}
