package ledger_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
)

// While the database refuses the writes, every batch fails: one is written
// each Linger (or sooner under load), and each logged a warning — hundreds
// a second during an outage. Now the first failure of a run is logged,
// then one warning a minute, and the first write that succeeds again says
// so; every failed event is still counted.
func TestFailedWritesLogOncePerRun(t *testing.T) {
	pool := newPool(t)
	s, err := pgledger.New(pool, pgledger.Options{Schema: freshSchema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	l := newLedger(t, s, ledger.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	record := func(rounds int) {
		for i := range rounds {
			l.Record(ledger.Event{MessageID: "m" + suffix(), Queue: "q", Status: ledger.StatusEnqueued, At: time.Now()})
			if err := l.Flush(testCtx(t, 20*time.Second)); err != nil {
				t.Fatalf("flush %d: %v", i, err)
			}
		}
	}
	record(20) // the table does not exist yet: every batch fails
	if st := l.Stats(); st.Failed != 20 || st.Written != 0 {
		t.Fatalf("stats %+v, want 20 failed", st)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("20 failed batches in a row logged %d warnings, want 1:\n%s", n, logs.String())
	}
	if err := s.Migrate(testCtx(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	record(3)
	if st := l.Stats(); st.Written != 3 {
		t.Fatalf("stats %+v, want 3 written after Migrate", st)
	}
	if n := strings.Count(logs.String(), "writes succeed again"); n != 1 {
		t.Errorf("the recovery was logged %d times, want 1:\n%s", n, logs.String())
	}
	if _, err := pool.Exec(testCtx(t, 20*time.Second), `DROP TABLE `+s.Table()); err != nil {
		t.Fatal(err)
	}
	record(2) // a new run of failures is logged again
	if n := strings.Count(logs.String(), "level=WARN"); n != 2 {
		t.Errorf("a second run of failures: %d warnings in all, want 2:\n%s", n, logs.String())
	}
}
