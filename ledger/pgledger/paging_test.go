package pgledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/sdk"
)

// pageWhileUpdating pages through the jobs of queue two at a time and,
// after the first page, calls update with the IDs not shown yet: it must
// update one of them so that its last update is the newest. It returns how
// many times each job was shown.
func pageWhileUpdating(t *testing.T, ctx context.Context, r ledger.Reader, queue string, update func(notShown []string)) map[string]int {
	t.Helper()
	seen := map[string]int{}
	f := ledger.Filter{Queue: queue, Limit: 2}
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatalf("still paging after %d pages: %v", pages, seen)
		}
		p, err := r.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range p.Jobs {
			seen[j.MessageID]++
		}
		if pages == 0 {
			var rest []string
			all, err := r.List(ctx, ledger.Filter{Queue: queue, Limit: ledger.MaxLimit})
			if err != nil {
				t.Fatal(err)
			}
			for _, j := range all.Jobs {
				if seen[j.MessageID] == 0 {
					rest = append(rest, j.MessageID)
				}
			}
			update(rest)
		}
		if p.Next == "" {
			return seen
		}
		f.After = p.Next
	}
}

func checkOnce(t *testing.T, seen map[string]int, ids []string) {
	t.Helper()
	if len(seen) != len(ids) {
		t.Errorf("paging showed %d jobs, want %d: %v", len(seen), len(ids), seen)
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("job %s shown %d times, want once (all: %v)", id, seen[id], seen)
		}
	}
}

// A job updated while an operator pages through List is still shown, once.
// Before, List paged by (updated_at, id), newest first: a job not shown yet
// that was updated between two pages moved ahead of the cursor and was
// never shown. On the ledger's own tables (Store).
func TestStoreListPagingWhileUpdated(t *testing.T) {
	_, s, ctx := setup(t)
	queue := "paging"
	base := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	var ids []string
	var batch []ledger.Event
	for i := range 7 {
		id := fmt.Sprintf("job-%d", i)
		ids = append(ids, id)
		batch = append(batch, ledger.Event{MessageID: id, Queue: queue, Type: "t", Status: ledger.StatusEnqueued, At: base.Add(time.Duration(i) * time.Minute)})
	}
	if err := s.Write(ctx, batch); err != nil {
		t.Fatal(err)
	}
	seen := pageWhileUpdating(t, ctx, s, queue, func(notShown []string) {
		id := notShown[len(notShown)-1] // the oldest: the last page
		now := time.Now()
		if err := s.Write(ctx, []ledger.Event{{MessageID: id, Queue: queue, Type: "t", Status: ledger.StatusRunning, Attempt: 1, At: now, StartedAt: now, Worker: "w"}}); err != nil {
			t.Fatal(err)
		}
		if j, err := s.Job(ctx, id); err != nil || !j.UpdatedAt.After(base.Add(time.Hour)) {
			t.Fatalf("job %s not updated: %+v %v", id, j, err)
		}
	})
	checkOnce(t, seen, ids)
}

// The same on the PostgreSQL broker's jobs table (Jobs).
func TestJobsListPagingWhileUpdated(t *testing.T) {
	ctx, pool, b, schema := jobsBroker(t)
	const queue = "paging"
	var ids []string
	for range 7 {
		m := &sdk.Message{Type: "t", Body: []byte(`{}`)}
		if err := b.Publish(ctx, queue, m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}
	table := schema + ".jobs"
	// Distinct update times, in the order of the rows.
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET updated_at = now() - interval '1 hour' + id * interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	r, err := pgledger.NewJobs(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	seen := pageWhileUpdating(t, ctx, r, queue, func(notShown []string) {
		id := notShown[len(notShown)-1]
		if tag, err := pool.Exec(ctx, `UPDATE `+table+` SET updated_at = now() WHERE message_id = $1`, id); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("update %s: %v %v", id, tag, err)
		}
	})
	checkOnce(t, seen, ids)
}
