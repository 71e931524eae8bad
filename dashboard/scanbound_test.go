package dashboard_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// unpaged is a broker seen as SQS is: it can neither page nor sweep its
// dead letters, so a listing reads them in one ListDeadLetters call, which
// holds every letter it reads. It records the limits it is asked for.
type unpaged struct {
	sdk.Broker
	sdk.DeadLetters
	sdk.Inspector

	mu    sync.Mutex
	asked []int
}

func (u *unpaged) ListDeadLetters(ctx context.Context, queue string, limit int) ([]*sdk.Message, error) {
	u.mu.Lock()
	u.asked = append(u.asked, limit)
	u.mu.Unlock()
	return u.DeadLetters.ListDeadLetters(ctx, queue, limit)
}

// A page far into the dead letters of a broker that cannot page them (SQS)
// reads no more of them than a scan may (10,000, the scan bound of package
// dlq): before, the dashboard asked the broker for offset+page-size
// letters, so ?offset=100000000 made it read, and hold in memory, every
// dead letter of the queue.
func TestPageOfUnpagedBrokerReadsBoundedScan(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 3, 0)
	u := &unpaged{Broker: b, DeadLetters: b, Inspector: b}
	d, err := dashboard.New(u, dashboard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/queues/billing?offset=100000000", "/api/queues/billing/dead-letters?offset=100000000&limit=10"} {
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != 200 {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.asked) == 0 {
		t.Fatal("the listing did not read the dead letters")
	}
	for _, n := range u.asked {
		if n <= 0 || n > 10000 {
			t.Errorf("ListDeadLetters asked for %d letters, want 1 to 10000 (the scan bound)", n)
		}
	}
}
