package rabbitmq

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestCloseWaitsForConfirms: PublishAsync results still waiting for their
// confirms when Close runs on a healthy server get their real outcome, not
// ErrClosed ("perhaps published") for messages the queue holds.
func TestCloseWaitsForConfirms(t *testing.T) {
	url := serverURL(t)
	b := newBroker(t, url, Options{})
	q := testQueue(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	const n = 300
	results := make([]*sdk.PublishResult, 0, n)
	for i := range n {
		r, err := b.PublishAsync(ctx, q, &sdk.Message{Type: "t", Body: []byte{byte(i)}})
		if err != nil {
			t.Fatalf("PublishAsync %d: %v", i, err)
		}
		results = append(results, r)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for i, r := range results {
		select {
		case <-r.Done():
		default:
			t.Fatalf("result %d unresolved after Close", i)
		}
		if err := r.Err(); err != nil {
			failed++
			if failed <= 3 {
				t.Errorf("result %d: %v, want nil (the server is healthy)", i, err)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d results failed after Close", failed, n)
	}
}
