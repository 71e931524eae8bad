package rabbitmq

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// slidingWindow is the raw baseline of the asynchronous benchmarks: one
// goroutine keeping up to 256 confirms outstanding, waiting for the oldest
// only when the window is full (the best a careful amqp091-go user writes).
const slidingWindow = 256

// BenchmarkPublishAsync compares, for both queue types and in alternating
// rounds, one goroutine publishing through berth's PublishAsync
// (MaxInFlight 256) with raw amqp091-go keeping a sliding window of 256
// deferred confirms.
func BenchmarkPublishAsync(b *testing.B) {
	for _, qt := range []QueueType{Classic, Quorum} {
		b.Run(string(qt), func(b *testing.B) {
			br, url, rawQ := benchQueue(b, qt)
			berthQ := testQueue(b, url)
			if err := br.DeclareQueue(context.Background(), berthQ); err != nil {
				b.Fatal(err)
			}
			ch := ownChannel(b, url, false)
			if err := ch.Confirm(false); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			body := make([]byte, benchBody)
			results := make([]*sdk.PublishResult, 0, benchRound)
			var rawT, berthT time.Duration
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(benchRound, b.N-done)
				start := time.Now()
				rawSliding(b, ch, rawQ, n)
				rawT += time.Since(start)

				start = time.Now()
				results = results[:0]
				for range n {
					res, err := br.PublishAsync(ctx, berthQ, &sdk.Message{Type: "bench", Body: body})
					if err != nil {
						b.Fatal(err)
					}
					results = append(results, res)
				}
				for _, res := range results {
					if err := res.Wait(ctx); err != nil {
						b.Fatal(err)
					}
				}
				berthT += time.Since(start)
				done += n
			}
			b.StopTimer()
			report(b, rawT, berthT)
		})
	}
}

// BenchmarkPublishConcurrent compares 256 goroutines each calling
// Publish with one message (an HTTP service enqueuing per request) with
// raw amqp091-go's sliding window of 256 confirms from one goroutine, in
// alternating rounds, for both queue types.
func BenchmarkPublishConcurrent(b *testing.B) {
	const callers = 256
	for _, qt := range []QueueType{Classic, Quorum} {
		b.Run(string(qt), func(b *testing.B) {
			br, url, rawQ := benchQueue(b, qt)
			berthQ := testQueue(b, url)
			if err := br.DeclareQueue(context.Background(), berthQ); err != nil {
				b.Fatal(err)
			}
			ch := ownChannel(b, url, false)
			if err := ch.Confirm(false); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			body := make([]byte, benchBody)
			round := 4 * benchRound
			var rawT, berthT time.Duration
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(round, b.N-done)
				start := time.Now()
				rawSliding(b, ch, rawQ, n)
				rawT += time.Since(start)

				start = time.Now()
				var wg sync.WaitGroup
				next := make(chan struct{}, n)
				for range n {
					next <- struct{}{}
				}
				close(next)
				for range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range next {
							if err := br.Publish(ctx, berthQ, &sdk.Message{Type: "bench", Body: body}); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				berthT += time.Since(start)
				done += n
			}
			b.StopTimer()
			report(b, rawT, berthT)
		})
	}
}

// rawSliding publishes n messages with the properties berth sets, keeping
// up to slidingWindow confirms outstanding.
func rawSliding(b *testing.B, ch *amqp.Channel, q string, n int) {
	b.Helper()
	ctx := context.Background()
	body := make([]byte, benchBody)
	ring := make([]*amqp.DeferredConfirmation, 0, slidingWindow)
	head := 0
	wait := func(dc *amqp.DeferredConfirmation) {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			b.Fatalf("confirm: %v %v", ok, err)
		}
	}
	for range n {
		if len(ring) == slidingWindow {
			wait(ring[head])
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: sdk.NewID(), Type: "bench", CorrelationId: sdk.NewID(), Body: body,
		})
		if err != nil {
			b.Fatal(err)
		}
		if len(ring) < slidingWindow {
			ring = append(ring, dc)
		} else {
			ring[head] = dc
			head = (head + 1) % slidingWindow
		}
	}
	for _, dc := range ring {
		wait(dc)
	}
}

// BenchmarkConsumeAckAll compares, for both queue types and in alternating
// rounds, berth's Receive of up to 100 + sdk.AckAll (one basic.ack with
// multiple per batch) with raw amqp091-go Consume acking with multiple
// every 100 deliveries, prefetch 100 on both sides.
func BenchmarkConsumeAckAll(b *testing.B) {
	for _, qt := range []QueueType{Classic, Quorum} {
		b.Run(string(qt), func(b *testing.B) {
			br, url, rawQ := benchQueue(b, qt)
			berthQ := testQueue(b, url)
			if err := br.DeclareQueue(context.Background(), berthQ); err != nil {
				b.Fatal(err)
			}
			pub := ownChannel(b, url, true)
			for done := 0; done < b.N; done += benchRound {
				rawPublish(b, pub, rawQ, min(benchRound, b.N-done))
				rawPublish(b, pub, berthQ, min(benchRound, b.N-done))
			}
			ch := ownChannel(b, url, false)
			if err := ch.Qos(benchPrefetch, 0, false); err != nil {
				b.Fatal(err)
			}
			dels, err := ch.Consume(rawQ, "", false, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			var rawT, berthT time.Duration
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(benchRound, b.N-done)
				start := time.Now()
				for i := 1; i <= n; i++ {
					d := <-dels
					if i%benchPrefetch == 0 || i == n {
						if err := d.Ack(true); err != nil {
							b.Fatal(err)
						}
					}
				}
				rawT += time.Since(start)

				start = time.Now()
				for got := 0; got < n; {
					ds, err := br.Receive(ctx, berthQ, min(benchPrefetch, n-got))
					if err != nil {
						b.Fatal(err)
					}
					if err := sdk.AckAll(ctx, br, ds); err != nil {
						b.Fatal(err)
					}
					got += len(ds)
				}
				berthT += time.Since(start)
				done += n
			}
			b.StopTimer()
			report(b, rawT, berthT)
		})
	}
}
