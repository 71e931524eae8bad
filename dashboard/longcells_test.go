package dashboard_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/sdk"
)

// longHeaders is a memory broker whose dead letters carry forged
// dead-letter headers of 100 KB each, as a producer publishing straight to
// a RabbitMQ .dlq can send.
type longHeaders struct{ *memory.Broker }

func (r longHeaders) DeadLetterPage(ctx context.Context, q, cursor string, limit int) ([]*sdk.Message, string, error) {
	ms, next, err := r.Broker.DeadLetterPage(ctx, q, cursor, limit)
	for _, m := range ms {
		m.Headers[sdk.HeaderDeadLetterAttempts] = strings.Repeat("9", 100_000)
		m.Headers[sdk.HeaderLastFailure] = strings.Repeat("x", 100_000)
	}
	return ms, next, err
}

// Every cell of the queue page's table is cut, as the ID, type, class and
// reason were: before, a forged attempts or last-failure header was shown
// whole (the latter twice, in the cell and its title), so each such dead
// letter added 300 KB to the page, and a page of 50 of them 15 MB.
func TestQueuePageCutsLongHeaders(t *testing.T) {
	mb, _ := memory.New(memory.Options{})
	t.Cleanup(func() { mb.Close() })
	seed(t, mb, 3, 0)
	srv := serve(t, longHeaders{mb}, dashboard.Options{})
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/billing")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	for _, long := range []string{strings.Repeat("9", 200), strings.Repeat("x", 200)} {
		if n := strings.Count(page, long); n > 0 {
			t.Errorf("the queue page shows a forged header whole (%d times); it is %d bytes", n, len(page))
			break
		}
	}
	if !strings.Contains(page, "999…") || !strings.Contains(page, "xxx…") {
		t.Errorf("the cut headers are not shown cut")
	}
}
