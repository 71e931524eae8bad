package memory_test

import (
	"errors"
	"math"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// TestDeadLetterPageHugeLimit: a page's limit is the caller's (the berth
// command and the dashboard pass what their user asked for), and "as many
// as there are" may well be math.MaxInt. Past the first page, the end of
// the page was cursor position + limit, which overflowed: DeadLetterPage
// panicked (makeslice: cap out of range) instead of returning the rest.
func TestDeadLetterPageHugeLimit(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	const q = "huge-page"
	msgs := []*sdk.Message{{Type: "a"}, {Type: "b"}, {Type: "c"}}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	for range msgs {
		if err := receiveOne(t, b, q).DeadLetter(ctx, errors.New("boom")); err != nil {
			t.Fatal(err)
		}
	}
	first, cursor, err := b.DeadLetterPage(ctx, q, "", 1)
	if err != nil || len(first) != 1 || cursor == "" {
		t.Fatalf("first page: %d letters, cursor %q, %v", len(first), cursor, err)
	}
	rest, next, err := b.DeadLetterPage(ctx, q, cursor, math.MaxInt)
	if err != nil || len(rest) != 2 || next != "" {
		t.Fatalf("rest with limit MaxInt: %d letters, cursor %q, %v; want 2, \"\", nil", len(rest), next, err)
	}
	if rest[0].ID != msgs[1].ID || rest[1].ID != msgs[2].ID {
		t.Fatalf("rest: %s, %s; want %s, %s", rest[0].ID, rest[1].ID, msgs[1].ID, msgs[2].ID)
	}
}
