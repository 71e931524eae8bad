package ledger_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
)

// closeCounter counts the Writes that start once closing is set.
type closeCounter struct {
	ledger.Store
	closing atomic.Bool
	during  atomic.Int64
}

func (c *closeCounter) Write(ctx context.Context, batch []ledger.Event) error {
	if c.closing.Load() {
		c.during.Add(1)
	}
	return c.Store.Write(ctx, batch)
}

// With the database not answering, Close wrote the buffer batch by batch,
// each waiting its own WriteTimeout: 8192 buffered events of 512 a batch
// held a process's shutdown for 16 × 10s, long past any orchestrator's
// grace period. Close now spends WriteTimeout on the buffer in all and
// drops, and counts, what is left.
func TestCloseBoundedWhenDatabaseHangs(t *testing.T) {
	s := hungStore(t)
	c := &closeCounter{Store: s}
	l, err := ledger.New(ledger.Options{Store: c, Buffer: 64, BatchSize: 4, Linger: -1,
		WriteTimeout: 200 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 64 {
		l.Record(ledger.Event{MessageID: "m" + string(rune('a'+i%26)) + suffix(), Queue: "q", Status: ledger.StatusEnqueued, At: time.Now()})
	}
	c.closing.Store(true)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if n := c.during.Load(); n > 2 {
		t.Errorf("Close made %d Writes to a database that does not answer, each waiting WriteTimeout; want at most 2 (one WriteTimeout in all)", n)
	}
	st := l.Stats()
	if st.Recorded != 64 || st.Written+st.Failed+st.Dropped != 64 || st.Buffered != 0 {
		t.Errorf("stats %+v: every event must be written, failed or dropped", st)
	}
}

// Close's warning about the events it dropped when its time ran out gave
// the count of the first batch dropped only (4 here), while every batch
// after it was dropped too: an operator reading it would think a few
// events lost where dozens were. It now gives them all, as counted in
// Stats.Dropped.
func TestCloseTimeoutLogsEveryDroppedEvent(t *testing.T) {
	s := hungStore(t)
	var logs syncbuf.Buffer
	l, err := ledger.New(ledger.Options{Store: s, Buffer: 64, BatchSize: 4, Linger: -1,
		WriteTimeout: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for range 64 {
		l.Record(ledger.Event{MessageID: "m" + suffix(), Queue: "q", Status: ledger.StatusEnqueued, At: time.Now()})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	if st.Dropped <= 4 {
		t.Fatalf("stats %+v: want more than one batch dropped by Close", st)
	}
	var lines []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "Close ran out of time") {
			lines = append(lines, line)
		}
	}
	if len(lines) != 1 || !strings.HasSuffix(lines[0], fmt.Sprintf(" events=%d", st.Dropped)) {
		t.Errorf("Close dropped %d events; want one warning saying events=%d, got:\n%s", st.Dropped, st.Dropped, strings.Join(lines, "\n"))
	}
}

// hungStore is a PostgreSQL ledger store on a database host that accepts
// connections and never answers (integration.SilentServer): every Write waits out its
// context.
func hungStore(t *testing.T) *pgledger.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+integration.SilentServer(t)+"/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgledger.New(pool, pgledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
