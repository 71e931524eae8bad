package jetstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// The broker stops a redrive's walk where its dead-letter stream ended when
// the redrive began (dlq.Bounded): a consumer that dead-letters every
// redriven letter again at once does not make the walk see one twice.
func TestRedriveStopsAtMark(t *testing.T) {
	b := newBroker(t, testOpts)
	var _ dlq.Bounded = b
	q := declare(t, b, "mark.x")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const n = 5
	for range n {
		if err := b.Publish(ctx, q, &sdk.Message{Type: "mark"}); err != nil {
			t.Fatal(err)
		}
	}
	deadLetter := func(want int) int {
		got := 0
		for got < want {
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			ds, _ := b.Receive(rctx, q, want-got)
			rcancel()
			if len(ds) == 0 {
				break
			}
			for _, d := range ds {
				if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("no"))); err != nil {
					t.Fatal(err)
				}
				got++
			}
		}
		return got
	}
	if got := deadLetter(n); got != n {
		t.Fatalf("dead-lettered %d, want %d", got, n)
	}
	if m, err := b.DeadLetterMark(ctx, "mark_empty_"+q); err != nil || m != "" {
		t.Errorf("mark of a queue without dead letters: %q, %v", m, err)
	}
	done, pages := 0, 0
	r, err := dlq.Apply(ctx, b, q, dlq.Filter{}, dlq.Redrive, dlq.Options{PageSize: 2}, func(d int) {
		pages++
		if pages > 3*n {
			cancel() // the walk does not end: stop it
		}
		deadLetter(d - done) // a consumer failing each redriven letter at once
		done = d
	})
	if err != nil {
		t.Fatalf("Apply: %v (%+v)", err, r)
	}
	if r.Done != n || r.Matched != n || r.Scanned != n || !r.Complete {
		t.Errorf("result %+v, want Done = Matched = Scanned = %d, complete", r, n)
	}
	if ms, err := b.ListDeadLetters(ctx, q, 0); err != nil || len(ms) != n {
		t.Errorf("%d dead letters after, %v; want %d", len(ms), err, n)
	}
}
