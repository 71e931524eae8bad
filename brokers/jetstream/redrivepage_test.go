package jetstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// TestRedriveAllInPages: RedriveDeadLetters with no ids held every dead
// letter of the queue, bodies included, in memory before redriving the
// first (a large dead-letter stream could exhaust the process). It now
// works a page at a time: with a page of 3, all 8 letters are redriven,
// each once, and letters dead-lettered again during the redrive are left
// for the next call.
func TestRedriveAllInPages(t *testing.T) {
	defer jetstream.SetRedrivePage(3)()
	b := newBroker(t, testOpts)
	q := declare(t, b, "redrivepage")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const n = 8
	for range n {
		if err := b.Publish(ctx, q, &sdk.Message{Type: "t", Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	for dead := 0; dead < n; {
		ds, err := b.Receive(ctx, q, n)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("no"))); err != nil {
				t.Fatal(err)
			}
			dead++
		}
	}
	if got, err := b.RedriveDeadLetters(ctx, q); err != nil || got != n {
		t.Fatalf("RedriveDeadLetters = %d, %v; want %d", got, err, n)
	}
	seen := map[string]bool{}
	for len(seen) < n {
		ds, err := b.Receive(ctx, q, n)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if seen[d.Message().ID] {
				t.Fatalf("%s redriven twice", d.Message().ID)
			}
			seen[d.Message().ID] = true
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st, err := b.Stats(ctx, q); err != nil || st.DeadLettered != 0 {
		t.Fatalf("after the redrive: %+v, %v; want no dead letter", st, err)
	}
}
