package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// slowRedrive is a broker's dead-letter API whose redrive by ID returns only
// once after returned: as a redrive of many letters does, whose first
// letters run (and may die again) while it moves the rest.
type slowRedrive struct {
	sdk.DeadLetters
	after func(ctx context.Context)
}

func (s slowRedrive) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	n, err := s.DeadLetters.RedriveDeadLetters(ctx, queue, ids...)
	if err == nil {
		s.after(ctx)
	}
	return n, err
}

// TestRedriveRacingItsJobsNextDeathKeepsDead: a job redriven by ID may run
// and die again before RedriveDeadLetters returns. Its redriven event must
// not then move the row, dead in the new generation, to "redriven" in a
// generation after it: a state it never leaves (its letter waits in the
// dead-letter queue). Before, the event was dated when the redrive
// returned, after the second death, and the store's guard (dead, updated
// no later than the redrive) let it through.
func TestRedriveRacingItsJobsNextDeathKeepsDead(t *testing.T) {
	e := memoryEnv(t)
	ctx := testCtx(t, 60*time.Second)
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return sdk.Permanent(errors.New("no")) })
	m := &sdk.Message{Type: "bad"}
	if err := e.publisher().Publish(ctx, e.queue, m); err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, e, h, sdk.WorkerOptions{})
	defer w.stop(t)
	waitJob(t, ctx, e.reader, m.ID, "dead", func(j *ledger.Job) bool { return j.Status == ledger.StatusDead })

	dl := e.led.DeadLetters(slowRedrive{DeadLetters: e.b, after: func(ctx context.Context) {
		waitJob(t, ctx, e.reader, m.ID, "dead again in generation 1", func(j *ledger.Job) bool {
			return j.Status == ledger.StatusDead && j.Generation == 1
		})
	}})
	if n, err := dl.RedriveDeadLetters(ctx, e.queue, m.ID); err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters = %d, %v; want 1", n, err)
	}
	if err := e.led.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	j, err := e.reader.Job(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != ledger.StatusDead || j.Generation != 1 {
		t.Errorf("job dead again in generation 1 before its redrive returned: %s in generation %d; want dead in generation 1", j.Status, j.Generation)
	}
}
