package memory_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// TestRedriveStatsConsistent: while a redrive moves dead letters back to
// their queue, Stats counts every letter in exactly one place, the queue or
// its dead-letter queue: never in neither (taken off the dead-letter list,
// not yet ready), never in both. The redrive took every letter off the list
// at once and put them back one by one, each under its own hold of the
// lock, and a Stats in between saw the letters not yet put back nowhere.
func TestRedriveStatsConsistent(t *testing.T) {
	for _, byID := range []bool{false, true} {
		t.Run(fmt.Sprintf("byID=%v", byID), func(t *testing.T) {
			ctx := ctxT(t)
			b, _ := memory.New(memory.Options{})
			defer b.Close()
			const total = 20000
			ids := make([]string, 0, total)
			for i := range total {
				m := &sdk.Message{ID: fmt.Sprintf("dead-%d", i), Type: "t"}
				memory.PlantDeadLetter(b, "q", m)
				if i%2 == 0 || !byID {
					ids = append(ids, m.ID)
				}
			}
			check := func(s sdk.QueueStats) error {
				if n := s.Ready + s.Delayed + s.InFlight + s.DeadLettered; n != total {
					return fmt.Errorf("Stats: ready %d + delayed %d + in flight %d + dead %d = %d, want %d",
						s.Ready, s.Delayed, s.InFlight, s.DeadLettered, n, total)
				}
				return nil
			}
			var (
				stop      atomic.Bool
				calls     atomic.Int64
				violation atomic.Pointer[error]
				wg        sync.WaitGroup
				started   = make(chan struct{})
			)
			wg.Go(func() {
				for i := 0; !stop.Load(); i++ {
					s, err := b.Stats(ctx, "q")
					if err == nil {
						err = check(s)
					}
					if err != nil {
						violation.CompareAndSwap(nil, &err)
						return
					}
					calls.Add(1)
					if i == 0 {
						close(started)
					}
				}
			})
			<-started
			var redriveIDs []string
			if byID {
				redriveIDs = ids
			}
			n, err := b.RedriveDeadLetters(ctx, "q", redriveIDs...)
			stop.Store(true)
			wg.Wait()
			if err != nil || n != len(ids) {
				t.Fatalf("RedriveDeadLetters = %d, %v; want %d, nil", n, err, len(ids))
			}
			if p := violation.Load(); p != nil {
				t.Fatalf("during the redrive (after %d consistent Stats): %v", calls.Load(), *p)
			}
			s, err := b.Stats(ctx, "q")
			if err != nil {
				t.Fatal(err)
			}
			if err := check(s); err != nil || s.Ready != int64(len(ids)) {
				t.Fatalf("after the redrive: ready %d, %v; want %d", s.Ready, err, len(ids))
			}
		})
	}
}

// TestRedriveWholeQueueStopsAtItsStart: a redrive of the whole dead-letter
// queue moves the letters dead when it began, once each, even when they die
// again while it runs: a consumer dead-letters every redriven message at
// once, and the redrive neither moves those again nor runs for ever.
func TestRedriveWholeQueueStopsAtItsStart(t *testing.T) {
	ctx := ctxT(t)
	b, _ := memory.New(memory.Options{})
	defer b.Close()
	const total = 5000
	for i := range total {
		memory.PlantDeadLetter(b, "q", &sdk.Message{ID: fmt.Sprintf("dead-%d", i), Type: "t"})
	}
	var (
		stop  atomic.Bool
		wg    sync.WaitGroup
		again atomic.Int64
	)
	wg.Go(func() {
		for !stop.Load() {
			ds, err := b.Receive(ctx, "q", 100)
			if err != nil {
				return
			}
			for _, d := range ds {
				if err := d.DeadLetter(ctx, sdk.Permanent(fmt.Errorf("again"))); err == nil {
					again.Add(1)
				}
			}
		}
	})
	n, err := b.RedriveDeadLetters(ctx, "q")
	if err != nil || n != total {
		t.Fatalf("RedriveDeadLetters = %d, %v; want %d, nil", n, err, total)
	}
	// Let the consumer take what the redrive made ready, then stop it.
	for {
		s, err := b.Stats(ctx, "q")
		if err != nil {
			t.Fatal(err)
		}
		if s.Ready == 0 && s.InFlight == 0 {
			if s.DeadLettered != total || again.Load() != total {
				t.Fatalf("dead %d, dead-lettered again %d; want %d each", s.DeadLettered, again.Load(), total)
			}
			break
		}
	}
	stop.Store(true)
	b.Close()
	wg.Wait()
}
