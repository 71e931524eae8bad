package dlq_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// streamScanner is a broker seen as SQS is (no Pager, no Sweeper) that can
// also stream its scan (dlq.Streamer); listed records a read of every
// letter whole (ListDeadLetters).
type streamScanner struct {
	dead   []*sdk.Message
	listed bool // ListDeadLetters was called
	moved  []string
}

func (s *streamScanner) ListDeadLetters(_ context.Context, _ string, limit int) ([]*sdk.Message, error) {
	s.listed = true
	return s.dead[:min(limit, len(s.dead))], nil
}

func (s *streamScanner) StreamDeadLetters(ctx context.Context, _ string, limit int, fn func([]*sdk.Message) error) error {
	all := s.dead[:min(limit, len(s.dead))]
	for len(all) > 0 {
		n := min(len(all), 10)
		page := make([]*sdk.Message, n)
		for i, m := range all[:n] {
			c := *m // a fresh copy per scan, as a broker decodes it
			page[i] = &c
		}
		if err := fn(page); err != nil {
			return err
		}
		all = all[n:]
	}
	return nil
}

func (s *streamScanner) GetDeadLetter(_ context.Context, _, id string) (*sdk.Message, error) {
	for _, m := range s.dead {
		if m.ID == id {
			return m, nil
		}
	}
	return nil, sdk.ErrNotFound
}

func (s *streamScanner) RedriveDeadLetters(_ context.Context, _ string, ids ...string) (int, error) {
	s.moved = append(s.moved, ids...)
	return len(ids), nil
}

func (s *streamScanner) DeleteDeadLetters(_ context.Context, _ string, ids ...string) (int, error) {
	return s.RedriveDeadLetters(context.Background(), "", ids...)
}

func (s *streamScanner) PurgeDeadLetters(context.Context, string) (int, error) { return 0, nil }

// A filtered change on a broker that can neither page nor sweep its dead
// letters (SQS) reads them through its streamed scan and keeps them without
// their bodies until the scan ends: before, it held every letter the scan
// read whole (up to -scan-limit letters of up to 256 KiB each).
func TestApplyKeepsNoBodiesOfAStreamedScan(t *testing.T) {
	s := &streamScanner{}
	var want []string
	for i := range 25 {
		m := &sdk.Message{ID: fmt.Sprintf("id-%02d", i), Type: "a", Body: make([]byte, 1<<10)}
		if i%2 == 0 {
			m.Type = "b"
			want = append(want, m.ID)
		}
		s.dead = append(s.dead, m)
	}
	f := dlq.Filter{Types: []string{"b"}}
	r, err := dlq.Apply(context.Background(), s, "q", f, dlq.Redrive, dlq.Options{PageSize: 4}, nil)
	if err != nil || r.Done != len(want) {
		t.Fatalf("Apply: %+v, %v; want %d redriven", r, err, len(want))
	}
	if s.listed {
		t.Error("the change read the letters whole (ListDeadLetters), not through the streamed scan")
	}
	if !slices.Equal(s.moved, want) {
		t.Errorf("moved %v, want %v", s.moved, want)
	}
}
