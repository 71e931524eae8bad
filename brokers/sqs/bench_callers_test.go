package sqs_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/smithy-go/middleware"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// BenchmarkPublishCallers measures how the coalescer shares SendMessageBatch
// calls among K goroutines publishing one message per call, on a network
// whose round trip, not the server, is the cost, as on real SQS: every
// SendMessageBatch waits benchRTT before it goes to the emulator. It
// reports msgs/s and msgs/call (messages per SendMessageBatch). On loopback
// alone (berthbench's SQS table) the emulator's CPU is the cost and fewer,
// fuller calls win; here the calls in flight together are what counts. The
// two settings weigh the coalescer's rules against each other (see
// BENCHMARKS.md, "Issue 19, 2026-12-04").
//
//	.ci/start-sqs && go test -run '^$' -bench PublishCallers -benchtime 2000x ./brokers/sqs/
func BenchmarkPublishCallers(b *testing.B) {
	for _, k := range []int{4, 16, 32, 64} {
		b.Run(fmt.Sprintf("rtt=%s/callers=%d", benchRTT, k), func(b *testing.B) { benchCallers(b, k) })
	}
}

// benchRTT is the round trip BenchmarkPublishCallers adds to every
// SendMessageBatch: a client in one AWS region and its queue in another is
// 20–80 ms away, one in the same region 2–10 ms.
const benchRTT = 20 * time.Millisecond

func benchCallers(b *testing.B, k int) {
	c := newCalls()
	br := newBroker(b, sqs.Options{VisibilityTimeout: time.Minute, WaitTime: time.Second}, c.option, delaySends(benchRTT))
	q := declare(b, br, "callers", false, sqs.QueueConfig{})
	ctx := context.Background()
	c.reset()
	var left atomic.Int64
	left.Store(int64(b.N))
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range k {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := br.Publish(ctx, q, &sdk.Message{Type: "bench", Body: []byte("x")}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	if n := c.get("SendMessageBatch"); n > 0 {
		b.ReportMetric(float64(b.N)/float64(n), "msgs/call")
	}
}

// delaySends is an API option that holds every SendMessageBatch for d
// before it is sent: a network round trip.
func delaySends(d time.Duration) func(*middleware.Stack) error {
	return onOperation("SendMessageBatch", func(ctx context.Context) error {
		t := time.NewTimer(d)
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	})
}
