package sqs_test

import (
	"testing"

	"github.com/berthq/berth/brokers/sqs"
)

// TestRedriveAndPurgeOfAllReportProgress: the broker's own redrive and
// purge of every dead letter move at most 10 letters a receive, and on a
// large dead-letter queue take minutes, with nothing to say how far they
// got until they returned. RedriveDeadLettersProgress and
// PurgeDeadLettersProgress move the same letters and return the same count,
// and call progress after each page with the running count: rising, the
// last one the count returned.
func TestRedriveAndPurgeOfAllReportProgress(t *testing.T) {
	const n = 25
	ctx := testCtx(t)
	for _, tc := range []struct {
		name string
		do   func(b *sqs.Broker, q string, progress func(int)) (int, error)
		// ready is how many messages the queue holds after it
		ready int64
	}{
		{"redrive", func(b *sqs.Broker, q string, p func(int)) (int, error) {
			return b.RedriveDeadLettersProgress(ctx, q, p)
		}, n},
		{"purge", func(b *sqs.Broker, q string, p func(int)) (int, error) { return b.PurgeDeadLettersProgress(ctx, q, p) }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBroker(t, fastOptions())
			q := declare(t, b, "progress"+tc.name, false, sqs.QueueConfig{})
			fillDeadLetters(t, b, q, n)
			var counts []int
			got, err := tc.do(b, q, func(done int) { counts = append(counts, done) })
			if err != nil || got != n {
				t.Fatalf("= %d, %v; want %d, nil", got, err, n)
			}
			rising := len(counts) >= 3 && counts[0] > 0 && counts[len(counts)-1] == n
			for i := 1; rising && i < len(counts); i++ {
				rising = counts[i] > counts[i-1]
			}
			if !rising {
				t.Fatalf("progress %v: want a rising count after each page (at most 10 a page), ending at %d", counts, n)
			}
			st, err := b.Stats(ctx, q)
			if err != nil || st.Ready != tc.ready || st.DeadLettered != 0 {
				t.Fatalf("stats %+v, %v; want %d ready, none dead-lettered", st, err, tc.ready)
			}
		})
	}
	// A nil progress is allowed (the dashboard passes none).
	b := newBroker(t, fastOptions())
	q := declare(t, b, "progressnil", false, sqs.QueueConfig{})
	fillDeadLetters(t, b, q, 3)
	if got, err := b.PurgeDeadLettersProgress(ctx, q, nil); err != nil || got != 3 {
		t.Fatalf("purge with no progress = %d, %v", got, err)
	}
}
