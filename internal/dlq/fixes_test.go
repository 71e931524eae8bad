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

// cutRedriver holds dead letters a, b, c, ... in order and, from the call
// that reaches letter failAt on, redrives the letters before it and fails
// with the count it did move: a broker moving letter by letter (SQS,
// JetStream) that loses its connection part-way through a page.
type cutRedriver struct {
	partialRedriver
	order  []string
	failAt string
	pe     bool // fail with an *sdk.PublishError naming the letters not moved
}

func (s *cutRedriver) ListDeadLetters(context.Context, string, int) ([]*sdk.Message, error) {
	var out []*sdk.Message
	for _, id := range s.order {
		if m, ok := s.dead[id]; ok {
			out = append(out, m)
		}
	}
	return out, nil
}

func (s *cutRedriver) RedriveDeadLetters(ctx context.Context, q string, ids ...string) (int, error) {
	for i, id := range ids {
		if id == s.failAt {
			n, err := s.partialRedriver.RedriveDeadLetters(ctx, q, ids[:i]...)
			if err != nil {
				return n, err
			}
			cause := fmt.Errorf("%w: connection reset", sdk.ErrUnavailable)
			if !s.pe {
				return n, cause
			}
			failed := map[string]error{}
			for _, id := range ids[i:] {
				failed[id] = cause
			}
			return n, &sdk.PublishError{Failed: failed}
		}
	}
	return s.partialRedriver.RedriveDeadLetters(ctx, q, ids...)
}

// A broker call that fails part-way through a page, after moving some of
// it, ends the Apply with its error; the result still counts what the
// call moved (it said how many), and the letters its PublishError names as
// refused are missed, named. Before, the call's count was dropped: an
// interrupted redrive said it had moved fewer letters than it had.
func TestApplyCountsWhatAFailedCallMoved(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    dlq.Filter
		pe   bool
	}{
		{"walk", dlq.Filter{Types: []string{"t"}}, false},
		{"walk, PublishError", dlq.Filter{Types: []string{"t"}}, true},
		{"ids", dlq.Filter{IDs: []string{"a", "b", "c", "d", "e", "f"}}, false},
		{"ids, PublishError", dlq.Filter{IDs: []string{"a", "b", "c", "d", "e", "f"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &cutRedriver{partialRedriver: partialRedriver{dead: map[string]*sdk.Message{}}, order: []string{"a", "b", "c", "d", "e", "f"}, failAt: "e", pe: tc.pe}
			for _, id := range b.order {
				b.dead[id] = &sdk.Message{ID: id, Type: "t"}
			}
			r, err := dlq.Apply(context.Background(), b, "q", tc.f, dlq.Redrive, dlq.Options{PageSize: 3}, nil)
			if !errors.Is(err, sdk.ErrUnavailable) {
				t.Fatalf("Apply error %v, want the broker's", err)
			}
			if r.Done != len(b.redriven) || r.Done != 4 {
				t.Errorf("Done %d; the broker redrove %v (4)", r.Done, b.redriven)
			}
			// Refused letters a PublishError names are missed; without one,
			// the rest of the page is left like letters never reached.
			if want := map[bool]int{true: 2, false: 0}[tc.pe]; r.Missed != want {
				t.Errorf("Missed %d, want %d", r.Missed, want)
			}
			var named []string
			for _, f := range r.Failed {
				named = append(named, f.ID)
			}
			if tc.pe && strings.Join(named, ",") != "e,f" {
				t.Errorf("Failed names %v, want [e f] from the PublishError", named)
			}
		})
	}
}
