package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// partialRedriver redrives the IDs it holds and names the others in an
// error wrapping sdk.ErrNotFound, with the count it did move: what the SQS
// broker's RedriveDeadLetters(ids...) does. vanish disappears after it has
// been looked up (another operator's purge).
type partialRedriver struct {
	dead     map[string]*sdk.Message
	redriven []string
	vanish   string
}

func (s *partialRedriver) ListDeadLetters(context.Context, string, int) ([]*sdk.Message, error) {
	return nil, nil
}

func (s *partialRedriver) GetDeadLetter(_ context.Context, _, id string) (*sdk.Message, error) {
	m, ok := s.dead[id]
	if !ok {
		return nil, sdk.ErrNotFound
	}
	if id == s.vanish {
		delete(s.dead, id)
	}
	return m, nil
}

func (s *partialRedriver) RedriveDeadLetters(_ context.Context, _ string, ids ...string) (int, error) {
	n := 0
	var missing []string
	for _, id := range ids {
		if _, ok := s.dead[id]; ok {
			delete(s.dead, id)
			s.redriven = append(s.redriven, id)
			n++
		} else {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return n, fmt.Errorf("dead letters %s: %w", strings.Join(missing, ","), sdk.ErrNotFound)
	}
	return n, nil
}

func (s *partialRedriver) PurgeDeadLetters(context.Context, string) (int, error) { return 0, nil }

// A redrive the broker did in part, naming the missing letters, counts what
// it moved as done: trying each again would report the moved ones missing.
func TestApplyCountsPartialRedrive(t *testing.T) {
	b := &partialRedriver{dead: map[string]*sdk.Message{"a": {ID: "a"}, "b": {ID: "b"}, "c": {ID: "c"}}, vanish: "c"}
	r, err := dlq.Apply(context.Background(), b, "q", dlq.Filter{IDs: []string{"a", "b", "c"}}, dlq.Redrive, dlq.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Done != len(b.redriven) || r.Done != 2 || r.Missed != 1 {
		t.Errorf("Done %d, Missed %d; the broker redrove %v", r.Done, r.Missed, b.redriven)
	}
}

// A consumer that dead-letters a redriven job again puts it back at the end
// of the dead-letter queue, where the same walk reaches it: it is not
// redriven twice, and the walk ends.
func TestApplyRedrivesEachLetterOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 3 {
		if err := b.Publish(ctx, "q", &sdk.Message{Type: "job"}); err != nil {
			t.Fatal(err)
		}
	}
	deadLetterAll := func() {
		for {
			rctx, rcancel := context.WithTimeout(ctx, 20*time.Millisecond)
			ds, _ := b.Receive(rctx, "q", 10)
			rcancel()
			if len(ds) == 0 {
				return
			}
			for _, d := range ds {
				if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
					t.Error(err)
				}
			}
		}
	}
	deadLetterAll()
	r, err := dlq.Apply(ctx, b, "q", dlq.Filter{Types: []string{"job"}}, dlq.Redrive, dlq.Options{PageSize: 1},
		func(int) { deadLetterAll() }) // a consumer runs between pages
	if err != nil {
		t.Fatalf("Apply: %v (result %+v)", err, r)
	}
	if r.Done != 3 {
		t.Errorf("Apply on 3 dead letters redrove %d times (result %+v)", r.Done, r)
	}
}
