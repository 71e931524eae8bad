package ledger_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// oldLetters is a dead-letter queue holding letters that died long ago.
type oldLetters struct {
	sdk.DeadLetters // nil: only listing is used
	msgs            []*sdk.Message
}

func (d oldLetters) ListDeadLetters(context.Context, string, int) ([]*sdk.Message, error) {
	out := make([]*sdk.Message, len(d.msgs))
	for i, m := range d.msgs {
		c := *m
		c.Headers = map[string]string{}
		for k, v := range m.Headers {
			c.Headers[k] = v
		}
		out[i] = &c
	}
	return out, nil
}

// TestJanitorConverges: dead letters that stay in their queue longer than
// the retention must not make the janitor purge and re-create their jobs at
// every run. Before, each run purged the dead job (finished before the
// retention) and its sync recorded it again from the letter (at the letter's
// failure time, so older than the retention again): the same rows were
// deleted and inserted every Interval for as long as the letters stayed,
// each time losing the job's history, and the run reports never settled.
// A job left running whose letter the broker dead-lettered is still made
// dead (then purged), not left running.
func TestJanitorConverges(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	store := newStore(t, newPool(t))
	led := newLedger(t, store, ledger.Options{Linger: -1})
	q := "ledger_" + suffix()
	died := time.Now().Add(-2 * time.Hour)

	letter := func(id string) *sdk.Message {
		m := &sdk.Message{ID: id, Type: "old"}
		sdk.AnnotateDeadLetter(m, q, 1, errors.New("boom"), died, died)
		m.SetHeader(sdk.HeaderDeadLetterAttempts, strconv.Itoa(1))
		return m
	}
	dead, stuck := sdk.NewID(), sdk.NewID()
	// dead: the Worker dead-lettered it; stuck: its row says running, the
	// broker dead-lettered it (the ledger never saw the end).
	for _, e := range []ledger.Event{
		{MessageID: dead, Queue: q, Status: ledger.StatusRunning, Attempt: 1, At: died.Add(-time.Minute), StartedAt: died.Add(-time.Minute)},
		{MessageID: dead, Queue: q, Status: ledger.StatusDead, Attempt: 1, At: died, Error: "boom"},
		{MessageID: stuck, Queue: q, Status: ledger.StatusRunning, Attempt: 1, At: died.Add(-time.Minute), StartedAt: died.Add(-time.Minute)},
	} {
		led.Record(e)
	}
	if err := led.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	runs := make(chan ledger.JanitorRun, 64)
	jctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- ledger.RunJanitor(jctx, ledger.JanitorOptions{
			Purger: store, Retention: time.Hour, Interval: 30 * time.Millisecond,
			Ledger: led, DeadLetters: oldLetters{msgs: []*sdk.Message{letter(dead), letter(stuck)}}, DeadLetterQueues: []string{q},
			Report: func(r ledger.JanitorRun) {
				_ = led.Flush(jctx) // the sync's events are written before the next run
				runs <- r
			},
		})
	}()
	var got []ledger.JanitorRun
	for range 8 {
		got = append(got, <-runs)
	}
	stop()
	<-done
	purged := 0
	for _, r := range got {
		if r.Err != nil {
			t.Fatalf("janitor run failed: %+v", r)
		}
		purged += r.Purged
	}
	if purged > 2 {
		t.Errorf("8 janitor runs over 2 old dead jobs purged %d rows (runs %+v); want each purged at most once, then nothing", purged, got)
	}
	if j, err := store.Job(ctx, stuck); err == nil && j.Status != ledger.StatusDead {
		t.Errorf("job dead-lettered by the broker: %+v; want dead or purged, not %s", j, j.Status)
	}
}
