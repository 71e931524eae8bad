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

// pagedLetters is a dead-letter queue that lists its oldest letters and
// pages through them all with a cursor, as the memory, PostgreSQL and
// JetStream brokers do.
type pagedLetters struct {
	sdk.DeadLetters // nil: only listing is used
	msgs            []*sdk.Message
}

func (d pagedLetters) ListDeadLetters(_ context.Context, _ string, limit int) ([]*sdk.Message, error) {
	return d.msgs[:min(limit, len(d.msgs))], nil
}

func (d pagedLetters) DeadLetterPage(_ context.Context, _, cursor string, limit int) ([]*sdk.Message, string, error) {
	from := 0
	if cursor != "" {
		var err error
		if from, err = strconv.Atoi(cursor); err != nil {
			return nil, "", errors.New("bad cursor")
		}
	}
	to := min(from+limit, len(d.msgs))
	next := ""
	if to < len(d.msgs) {
		next = strconv.Itoa(to)
	}
	return d.msgs[from:to], next, nil
}

// TestJanitorSyncsLettersPastTheLimit: a dead-letter queue keeps its
// letters until someone redrives or purges them, and brokers list the
// oldest first. The janitor listed the first DeadLetterLimit letters at
// every run, so once the queue held more, a job the broker dead-lettered
// later was never recorded dead: its row stayed running until the stale
// purge deleted it. Where the broker pages, each run takes up the walk
// where the last one stopped, one page at a time.
func TestJanitorSyncsLettersPastTheLimit(t *testing.T) {
	var letters []*sdk.Message
	for i := range 5 {
		m := &sdk.Message{ID: "letter-" + strconv.Itoa(i)}
		sdk.AnnotateDeadLetter(m, "q", 3, sdk.ErrMaxDeliveries, time.Time{}, time.Now())
		letters = append(letters, m)
	}
	// The broker's dead letters, and the same through Ledger.DeadLetters.
	for _, wrapped := range []bool{false, true} {
		ctx := testCtx(t, 30*time.Second)
		store := &capture{}
		led := newLedger(t, store, ledger.Options{Linger: -1})
		var dl sdk.DeadLetters = pagedLetters{msgs: letters}
		if wrapped {
			dl = led.DeadLetters(dl)
		}
		runs := make(chan ledger.JanitorRun, 64)
		jctx, stop := context.WithCancel(ctx)
		t.Cleanup(stop)
		done := make(chan error, 1)
		go func() {
			done <- ledger.RunJanitor(jctx, ledger.JanitorOptions{
				Ledger: led, DeadLetters: dl, DeadLetterQueues: []string{"q"}, DeadLetterLimit: 2,
				Interval: time.Millisecond,
				Report: func(r ledger.JanitorRun) {
					select {
					case runs <- r:
					default:
					}
				},
			})
		}()
		// Three runs of two letters each cover the five.
		for range 3 {
			select {
			case r := <-runs:
				if r.Err != nil {
					t.Fatal(r.Err)
				}
			case <-ctx.Done():
				t.Fatal("the janitor did not run")
			}
		}
		stop()
		<-done
		if err := led.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		dead := map[string]bool{}
		for _, e := range store.all() {
			if e.Status == ledger.StatusDead {
				dead[e.MessageID] = true
			}
		}
		for _, m := range letters {
			if !dead[m.ID] {
				t.Errorf("wrapped %v: %s never recorded dead; recorded %v", wrapped, m.ID, dead)
			}
		}
	}
}
