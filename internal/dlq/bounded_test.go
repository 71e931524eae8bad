package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// boundedBroker is a broker that stops a walk at a mark: the memory and
// PostgreSQL brokers are.
type boundedBroker interface {
	broker
	dlq.Bounded
}

// countingRedriver counts how many times each dead letter is redriven.
type countingRedriver struct {
	broker
	mu    sync.Mutex
	times map[string]int
}

func (c *countingRedriver) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	n, err := c.broker.RedriveDeadLetters(ctx, queue, ids...)
	if err == nil {
		c.mu.Lock()
		for _, id := range ids {
			c.times[id]++
		}
		c.mu.Unlock()
	}
	return n, err
}

// boundedCounter is a countingRedriver that pages to a mark.
type boundedCounter struct {
	*countingRedriver
	dlq.Bounded
}

// A redrive of every dead letter while a consumer dead-letters each
// redriven letter again at once: each comes back after the end of the
// dead-letter queue as the redrive found it, so the walk ends there,
// redrives each letter once and matches each once. A broker that is not
// Bounded (hidden here) sees each letter come back, and skips it.
func TestRedriveStopsWhereTheQueueEnded(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		bb, ok := b.(boundedBroker)
		if !ok {
			t.Fatalf("%T is not dlq.Bounded", b)
		}
		for _, bounded := range []bool{true, false} {
			t.Run(fmt.Sprintf("bounded=%v", bounded), func(t *testing.T) {
				redriveOnceWhileFailing(t, bb, bounded)
			})
		}
	})
}

func redriveOnceWhileFailing(t *testing.T, b boundedBroker, bounded bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 13
	queue := fmt.Sprintf("billing%v", bounded)
	ids := seed(t, b, queue, n)
	deadLetterAll := func() {
		for {
			rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			ds, _ := b.Receive(rctx, queue, 100)
			rcancel()
			if len(ds) == 0 {
				return
			}
			for _, d := range ds {
				if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("still bad"))); err != nil {
					t.Error(err)
				}
			}
		}
	}
	c := &countingRedriver{broker: b, times: map[string]int{}}
	var dl sdk.DeadLetters = c
	if bounded {
		dl = boundedCounter{c, b}
	}
	if _, ok := dl.(dlq.Bounded); ok != bounded {
		t.Fatalf("%T: Bounded %v, want %v", dl, ok, bounded)
	}
	pages := 0
	r, err := dlq.Apply(ctx, dl, queue, dlq.Filter{}, dlq.Redrive, dlq.Options{PageSize: 4}, func(int) {
		pages++
		if pages > 3*n {
			cancel() // the walk does not end: stop it
		}
		deadLetterAll() // a consumer that fails every redriven letter at once
	})
	if err != nil {
		t.Fatalf("Apply: %v (result %+v)", err, r)
	}
	if r.Done != n || r.Matched != n || !r.Complete || r.Missed != 0 {
		t.Errorf("result %+v, want Done = Matched = %d, complete", r, n)
	}
	if bounded && r.Scanned != n {
		t.Errorf("scanned %d, want %d: the walk went past the end of the queue as it began", r.Scanned, n)
	}
	for _, id := range ids {
		if c.times[id] != 1 {
			t.Errorf("letter %s redriven %d times", id, c.times[id])
		}
	}
	if len(c.times) != n {
		t.Errorf("redrove %d letters, want %d", len(c.times), n)
	}
	st, err := b.Stats(ctx, queue)
	if err != nil || st.DeadLettered != n || st.Ready != 0 {
		t.Errorf("stats %+v %v: every letter should be dead again", st, err)
	}
}

// synthDead is a dead-letter queue of letters 1..n made up as they are
// read, so that it holds no per-letter state: redriving takes letters from
// its front, in order. It pages with a cursor and stops at a mark.
type synthDead struct {
	n, taken int // letters 1..taken are redriven
}

func (s *synthDead) page(cursor string, upTo, limit int) ([]*sdk.Message, string, error) {
	after := 0
	if cursor != "" {
		var err error
		if after, err = strconv.Atoi(cursor); err != nil {
			return nil, "", err
		}
	}
	after = max(after, s.taken)
	end := min(upTo, after+limit)
	var out []*sdk.Message
	for i := after + 1; i <= end; i++ {
		out = append(out, &sdk.Message{ID: "m" + strconv.Itoa(i), Type: "job"})
	}
	next := ""
	if end < upTo {
		next = strconv.Itoa(end)
	}
	return out, next, nil
}

func (s *synthDead) DeadLetterPage(_ context.Context, _, cursor string, limit int) ([]*sdk.Message, string, error) {
	return s.page(cursor, s.n, limit)
}

func (s *synthDead) DeadLetterMark(context.Context, string) (string, error) {
	if s.taken == s.n {
		return "", nil
	}
	return strconv.Itoa(s.n), nil
}

func (s *synthDead) DeadLetterPageTo(_ context.Context, _, cursor, mark string, limit int) ([]*sdk.Message, string, error) {
	if mark == "" {
		return nil, "", nil
	}
	upTo, err := strconv.Atoi(mark)
	if err != nil {
		return nil, "", err
	}
	return s.page(cursor, upTo, limit)
}

func (s *synthDead) ListDeadLetters(ctx context.Context, q string, limit int) ([]*sdk.Message, error) {
	page, _, err := s.page("", s.n, limit)
	return page, err
}

func (s *synthDead) GetDeadLetter(_ context.Context, q, id string) (*sdk.Message, error) {
	return nil, sdk.ErrNotFound
}

func (s *synthDead) RedriveDeadLetters(_ context.Context, _ string, ids ...string) (int, error) {
	for _, id := range ids {
		if id != "m"+strconv.Itoa(s.taken+1) {
			return 0, fmt.Errorf("redrive of %s out of order (taken %d): %w", id, s.taken, sdk.ErrNotFound)
		}
		s.taken++
	}
	return len(ids), nil
}

func (s *synthDead) PurgeDeadLetters(context.Context, string) (int, error) { return 0, nil }

// A redrive of every dead letter of a Bounded broker holds no per-letter
// state: the live heap at its last page is about what it was before,
// however many letters it redrove (a set of their IDs would hold some tens
// of bytes each: megabytes here).
func TestRedriveHoldsBoundedMemory(t *testing.T) {
	const n = 200_000
	s := &synthDead{n: n}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	var grew int64
	r, err := dlq.Apply(context.Background(), s, "q", dlq.Filter{}, dlq.Redrive, dlq.Options{PageSize: 1000}, func(done int) {
		if done == n {
			grew = int64(heap()) - int64(before)
		}
	})
	if err != nil || r.Done != n || r.Matched != n || !r.Complete {
		t.Fatalf("Apply: %+v %v", r, err)
	}
	if limit := int64(2 << 20); grew > limit {
		t.Errorf("the live heap grew by %d bytes over a redrive of %d letters (%.1f per letter), want at most %d", grew, n, float64(grew)/n, limit)
	}
	t.Logf("live heap grew by %d bytes over %d letters", grew, n)
}

// DeadLetterPageTo pages the dead letters up to the mark and no further:
// one dead-lettered after the mark is not seen, and the last page up to the
// mark says so (next cursor ""). A queue without dead letters has the mark
// "", which pages nothing.
func TestDeadLetterPageToMark(t *testing.T) {
	brokers(t, func(t *testing.T, b broker) {
		ctx := context.Background()
		bb := b.(boundedBroker)
		if m, err := bb.DeadLetterMark(ctx, "billing"); err != nil || m != "" {
			t.Fatalf("mark of no dead letters: %q, %v", m, err)
		}
		if ms, next, err := bb.DeadLetterPageTo(ctx, "billing", "", "", 10); err != nil || len(ms) != 0 || next != "" {
			t.Fatalf("page to the empty mark: %d letters, %q, %v", len(ms), next, err)
		}
		ids := seed(t, b, "billing", 6)
		mark, err := bb.DeadLetterMark(ctx, "billing")
		if err != nil || mark == "" {
			t.Fatalf("mark: %q, %v", mark, err)
		}
		later := seed(t, b, "billing", 1)[0]
		var got []string
		cursor, pages := "", 0
		for {
			ms, next, err := bb.DeadLetterPageTo(ctx, "billing", cursor, mark, 3)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, m := range ms {
				got = append(got, m.ID)
			}
			if next == "" || pages > 10 {
				break
			}
			cursor = next
		}
		if fmt.Sprint(got) != fmt.Sprint(ids) || pages != 2 {
			t.Errorf("paged to the mark %v in %d pages, want %v in 2 (not %s, dead-lettered after)", got, pages, ids, later)
		}
		all, _, err := bb.DeadLetterPage(ctx, "billing", "", 100)
		if err != nil || len(all) != 7 {
			t.Errorf("DeadLetterPage: %d letters, %v; want 7", len(all), err)
		}
	})
}
