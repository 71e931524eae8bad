package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// TestCloseWaitsForPublishAcks: PublishAsync results still waiting for
// their acks when Close runs on a healthy server get their real outcome.
// Close flushed for 2 s and then failed every pending result ErrClosed —
// "perhaps published" for messages the stream had stored (75 of 100 in a
// reviewer's run) — so a producer retried or reported messages that were in
// fact published.
func TestCloseWaitsForPublishAcks(t *testing.T) {
	b := newBroker(t, jetstream.Options{})
	q := declare(t, b, "closeacks")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 200
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
	// Every message is in the stream, once.
	c := newBroker(t, jetstream.Options{})
	st, err := c.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != n {
		t.Errorf("stream holds %d ready messages, want %d", st.Ready, n)
	}
}
