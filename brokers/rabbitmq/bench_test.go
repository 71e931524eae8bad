package rabbitmq

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// Benchmark parameters shared by berth and the raw client.
const (
	benchBody     = 256 // bytes
	benchWindow   = 100 // confirms awaited together (one Publish of 100 messages)
	benchPrefetch = 100
	benchRound    = 500 // messages per turn; berth and raw take turns
)

// BenchmarkPublish publishes 256-byte persistent messages with confirms, a
// window of 100, through berth (Publish of 100 messages) and through raw
// amqp091-go (100 deferred confirms), for both queue types. The two take
// turns of 500 messages so that load from other processes hits both alike;
// each reports its msgs/s and "berth/raw" is the ratio.
func BenchmarkPublish(b *testing.B) {
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
			msgs := make([]*sdk.Message, benchWindow)
			var rawT, berthT time.Duration
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(benchRound, b.N-done)
				start := time.Now()
				rawPublish(b, ch, rawQ, n)
				rawT += time.Since(start)

				start = time.Now()
				for sent := 0; sent < n; {
					batch := msgs[:min(benchWindow, n-sent)]
					for i := range batch {
						batch[i] = &sdk.Message{Type: "bench", Body: body}
					}
					if err := br.Publish(ctx, berthQ, batch...); err != nil {
						b.Fatal(err)
					}
					sent += len(batch)
				}
				berthT += time.Since(start)
				done += n
			}
			b.StopTimer()
			report(b, rawT, berthT)
		})
	}
}

// BenchmarkConsume consumes and acks, one by one, 256-byte messages with a
// prefetch of 100, through berth (Receive of up to 100 + Ack) and through
// raw amqp091-go (Consume + Ack), for both queue types, taking turns of 500
// messages like BenchmarkPublish.
func BenchmarkConsume(b *testing.B) {
	for _, qt := range []QueueType{Classic, Quorum} {
		b.Run(string(qt), func(b *testing.B) {
			br, url, rawQ := benchQueue(b, qt)
			berthQ := testQueue(b, url)
			if err := br.DeclareQueue(context.Background(), berthQ); err != nil {
				b.Fatal(err)
			}
			pub := ownChannel(b, url, true)
			// Fill both queues in alternating rounds: on classic queues the
			// queue filled first is measurably slower to drain.
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
				for range n {
					d := <-dels
					if err := d.Ack(false); err != nil {
						b.Fatal(err)
					}
				}
				rawT += time.Since(start)

				start = time.Now()
				for got := 0; got < n; {
					ds, err := br.Receive(ctx, berthQ, min(benchPrefetch, n-got))
					if err != nil {
						b.Fatal(err)
					}
					for _, d := range ds {
						if err := d.Ack(ctx); err != nil {
							b.Fatal(err)
						}
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

func report(b *testing.B, rawT, berthT time.Duration) {
	raw := float64(b.N) / rawT.Seconds()
	berth := float64(b.N) / berthT.Seconds()
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(raw, "raw-msgs/s")
	b.ReportMetric(berth, "berth-msgs/s")
	b.ReportMetric(berth/raw, "berth/raw")
}

// benchQueue declares a fresh queue of type qt with berth's topology (so
// berth and the raw client use the same kind of queue) and returns a broker
// configured like the raw client.
func benchQueue(b *testing.B, qt QueueType) (*Broker, string, string) {
	b.Helper()
	url := serverURL(b)
	q := testQueue(b, url)
	br := newBroker(b, url, Options{QueueType: qt, Prefetch: benchPrefetch, Logger: quiet})
	if err := br.DeclareQueue(context.Background(), q); err != nil {
		b.Fatal(err)
	}
	return br, url, q
}

// rawPublish publishes n messages with confirms, benchWindow at a time,
// with the same properties berth sets (IDs, type, persistent, mandatory).
func rawPublish(b *testing.B, ch *amqp.Channel, q string, n int) {
	b.Helper()
	ctx := context.Background()
	body := make([]byte, benchBody)
	dcs := make([]*amqp.DeferredConfirmation, 0, benchWindow)
	for sent := 0; sent < n; {
		dcs = dcs[:0]
		for ; len(dcs) < benchWindow && sent < n; sent++ {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, MessageId: sdk.NewID(), Type: "bench", CorrelationId: sdk.NewID(), Body: body,
			})
			if err != nil {
				b.Fatal(err)
			}
			dcs = append(dcs, dc)
		}
		for _, dc := range dcs {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				b.Fatalf("confirm: %v %v", ok, err)
			}
		}
	}
}
