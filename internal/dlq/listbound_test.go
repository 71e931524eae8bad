package dlq_test

import (
	"context"
	"math"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/internal/dlq"
)

// A limit or offset as large as an int holds (berth dlq list -limit
// 9223372036854775807 -offset 3, a dashboard URL's offset) is no limit, not
// an end of page that wrapped round below its start: that showed no dead
// letter, and named the same offset as the next page, for ever.
func TestListLimitPastTheIntRange(t *testing.T) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	seed(t, b, "q", 7)
	ctx := context.Background()
	for _, f := range []dlq.Filter{{}, {Types: []string{"billing.charge"}}} {
		want := 7 - 3
		if len(f.Types) > 0 {
			want = 4 - 3
		}
		l, err := dlq.List(ctx, b, "q", f, 3, math.MaxInt, dlq.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Messages) != want || l.Next != -1 {
			t.Errorf("filter %v, offset 3, limit MaxInt: %d shown (want %d), next %d (want -1)", f.Types, len(l.Messages), want, l.Next)
		}
		l, err = dlq.List(ctx, b, "q", f, math.MaxInt, 50, dlq.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Messages) != 0 || l.Next != -1 {
			t.Errorf("filter %v, offset MaxInt: %d shown, next %d (want none, -1)", f.Types, len(l.Messages), l.Next)
		}
	}
}
