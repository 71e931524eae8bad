package ledger_test

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/ledger"
)

// tally is a Store that counts the events it is given.
type tally struct{ n atomic.Int64 }

func (t *tally) Write(_ context.Context, batch []ledger.Event) error {
	t.n.Add(int64(len(batch)))
	return nil
}

// TestRecordRacingCloseIsAccountedFor: goroutines record without pause
// while Close runs, and a little after it. Once every Record has returned,
// each one is accounted for exactly once: written (and the store has it) or
// dropped, with nothing left in the buffer. A Record that passed the closed
// check just before Close, then put its event in the buffer after the
// writer's last drain, used to leave it there: recorded, never written,
// never dropped.
//
// The window is a few instructions wide: more threads than CPUs make the
// OS preempt recorders inside it (the test is not parallel; the setting is
// restored at its end).
func TestRecordRacingCloseIsAccountedFor(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(16))
	for _, writers := range []int{1, 3} {
		for round := range 20 {
			store := &tally{}
			l, err := ledger.New(ledger.Options{Store: store, Buffer: 256, Writers: writers, Linger: -1, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			var closed atomic.Bool
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := range 64 {
				wg.Go(func() {
					<-start
					e := ledger.Event{MessageID: "m", Queue: "q", Status: ledger.StatusEnqueued, At: time.Now()}
					// Until Close has returned (at most 2,000), then a few more.
					for i, after := 0, 0; after < 5; i++ {
						if i >= 2000 || closed.Load() {
							after++
						}
						e.Attempt = g
						l.Record(e)
						calls.Add(1)
					}
				})
			}
			close(start)
			time.Sleep(time.Duration(round%4) * 200 * time.Microsecond)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			closed.Store(true)
			wg.Wait()
			n := calls.Load()
			s := l.Stats()
			if s.Recorded != n || s.Written+s.Dropped+s.Failed != n || s.Buffered != 0 || store.n.Load() != s.Written {
				t.Fatalf("writers=%d round %d: %d Record calls, store got %d, stats %+v: want recorded = written + dropped = calls, nothing buffered",
					writers, round, n, store.n.Load(), s)
			}
		}
	}
}

// TestRecordAfterCloseDropsAtOnce: Record after Close neither blocks (even
// with the buffer full and a long BlockTimeout) nor is lost: it is dropped
// and counted.
func TestRecordAfterCloseDropsAtOnce(t *testing.T) {
	c := &capture{gate: make(chan struct{})}
	var logs syncbuf.Buffer
	l, err := ledger.New(ledger.Options{Store: c, Buffer: 2, BatchSize: 1, Linger: -1, BlockTimeout: time.Hour,
		WriteTimeout: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // one taken by the stuck writer, two fill the buffer
		l.Record(ledger.Event{MessageID: "m", Status: ledger.StatusEnqueued, At: time.Now()})
	}
	if err := l.Close(); err != nil { // the stuck writes time out, or are dropped once Close's WriteTimeout is up
		t.Fatal(err)
	}
	start := time.Now()
	for range 5 {
		l.Record(ledger.Event{MessageID: "late", Status: ledger.StatusEnqueued, At: time.Now()})
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Record after Close took %v", d)
	}
	s := l.Stats()
	if s.Recorded != 8 || s.Dropped < 5 || s.Failed+s.Dropped != 8 || s.Written != 0 || s.Buffered != 0 {
		t.Errorf("stats %+v: want 8 recorded, the 3 before Close failed or dropped, the 5 after dropped", s)
	}
	// Said once, and as what it is: not "buffer full", which would send an
	// operator after a writer that is not behind but stopped.
	out := logs.String()
	if n := strings.Count(out, "recorded after Close"); n != 1 {
		t.Errorf("%d log lines about Records after Close, want 1:\n%s", n, out)
	}
	if strings.Contains(out, "buffer full") {
		t.Errorf("a Record after Close logged as a full buffer:\n%s", out)
	}
}
