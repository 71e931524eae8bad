package dlq_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// A change (and its preview) of chosen IDs on a broker without
// dlq.IDCounter that can neither page nor sweep (SQS) counts the letters of
// the IDs with one walk of the dead-letter queue: that walk read every
// letter whole (ListDeadLetters: up to -scan-limit letters of up to 256 KiB
// each) instead of through the streamed scan, which keeps one page.
func TestIDCountStreamsTheScan(t *testing.T) {
	s := &streamScanner{}
	for i := range 25 {
		s.dead = append(s.dead, &sdk.Message{ID: fmt.Sprintf("id-%02d", i%20), Type: "a", Body: make([]byte, 1<<10)})
	}
	f := dlq.Filter{IDs: []string{"id-03", "id-11"}}
	p, _, missing, err := dlq.Preview(context.Background(), s, "q", f, dlq.Options{PageSize: 4}, 5)
	if err != nil || p.Matched != 3 || len(missing) != 0 {
		t.Fatalf("Preview: %+v, missing %v, %v; want 3 matched", p, missing, err)
	}
	if s.listed {
		t.Error("the preview read the letters whole (ListDeadLetters), not through the streamed scan")
	}
	s.listed = false
	r, err := dlq.Apply(context.Background(), s, "q", f, dlq.Redrive, dlq.Options{PageSize: 4, Limit: p.Matched}, nil)
	if err != nil || r.Matched != 3 || len(s.moved) != 2 {
		t.Fatalf("Apply: %+v, moved %v, %v; want 3 matched, 2 IDs moved", r, s.moved, err)
	}
	if s.listed {
		t.Error("the change read the letters whole (ListDeadLetters), not through the streamed scan")
	}
}
