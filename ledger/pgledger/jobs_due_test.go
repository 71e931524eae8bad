package pgledger_test

import (
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// TestJobsDelayedShowsDue: on the PostgreSQL broker's jobs table a job
// published with a delay is a queued row whose available_at is its due
// time, yet Jobs showed NextAttemptAt only for retry rows: a job delayed
// by an hour read as enqueued with no time at all, as if it were due now.
// It now shows when it is due, as the ledger's own tables do
// (ledger.Publisher records it); a job due now shows none.
func TestJobsDelayedShowsDue(t *testing.T) {
	ctx, pool, b, schema := jobsBroker(t)
	delayed := &sdk.Message{Type: "t", Body: []byte(`{}`), Delay: time.Hour}
	now := &sdk.Message{Type: "t", Body: []byte(`{}`)}
	if err := b.Publish(ctx, "due", delayed, now); err != nil {
		t.Fatal(err)
	}
	var due time.Time
	if err := pool.QueryRow(ctx, `SELECT available_at FROM `+schema+`.jobs WHERE message_id = $1`, delayed.ID).Scan(&due); err != nil {
		t.Fatal(err)
	}
	r, err := pgledger.NewJobs(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	j, err := r.Job(ctx, delayed.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != ledger.StatusEnqueued || !j.NextAttemptAt.Equal(due) {
		t.Errorf("delayed job: status %s, next attempt %v; want enqueued, due %v", j.Status, j.NextAttemptAt, due)
	}
	j, err = r.Job(ctx, now.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != ledger.StatusEnqueued || !j.NextAttemptAt.IsZero() {
		t.Errorf("job due now: status %s, next attempt %v; want enqueued, none", j.Status, j.NextAttemptAt)
	}
	page, err := r.List(ctx, ledger.Filter{Queue: "due"})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]time.Time{}
	for _, j := range page.Jobs {
		listed[j.MessageID] = j.NextAttemptAt
	}
	if len(listed) != 2 || !listed[delayed.ID].Equal(due) || !listed[now.ID].IsZero() {
		t.Errorf("List: next attempts %v; want %s due %v, %s none", listed, delayed.ID, due, now.ID)
	}
}
