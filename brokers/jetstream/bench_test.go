package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// Benchmark parameters shared by berth and the raw client.
const (
	benchBody   = 256 // bytes
	benchWindow = 100 // publish acks awaited together; messages per fetch
	benchRound  = 500 // messages per turn; berth and raw take turns
)

// BenchmarkPublish publishes 256-byte messages with JetStream publish acks,
// a window of 100, through berth (Publish of 100 messages) and through raw
// nats.go (100 PublishMsgAsync with a Nats-Msg-Id and type and correlation
// headers, then their acks), on
// streams of the same configuration (berth's). The two take turns of 500
// messages, so that load from other processes hits both alike; each reports
// its msgs/s and "berth/raw" is the ratio.
func BenchmarkPublish(b *testing.B) {
	br := newBroker(b, jetstream.Options{Logger: quiet})
	berthQ, rawQ := declare(b, br, "bench"), declare(b, br, "benchraw")
	rawSubject := br.Subject(rawQ)
	js := rawJS(b)
	ctx := context.Background()
	body := make([]byte, benchBody)
	msgs := make([]*sdk.Message, benchWindow)
	var rawT, berthT time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(benchRound, b.N-done)
		start := time.Now()
		rawPublish(b, js, rawSubject, n)
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
}

// BenchmarkConsume fetches up to 100 messages at a time and acks them one
// by one, through berth (Receive + Ack) and through raw nats.go (Fetch +
// Ack on the same kind of durable consumer), taking turns of 500 messages.
// "sync" compares berth's default Ack (it waits for JetStream's answer)
// with raw DoubleAck; "async" compares berth with AsyncAck with raw Ack
// (neither waits).
func BenchmarkConsume(b *testing.B) {
	for _, mode := range []string{"sync", "async"} {
		b.Run(mode, func(b *testing.B) {
			br := newBroker(b, jetstream.Options{Logger: quiet, AsyncAck: mode == "async"})
			berthQ, rawQ := declare(b, br, "bench"), declare(b, br, "benchraw")
			js := rawJS(b)
			ctx := context.Background()
			// Both queues get the same messages: berth's, published by berth.
			body := make([]byte, benchBody)
			for done := 0; done < b.N; done += benchWindow {
				batch := make([]*sdk.Message, min(benchWindow, b.N-done))
				for i := range batch {
					batch[i] = &sdk.Message{Type: "bench", Body: body}
				}
				for _, q := range []string{rawQ, berthQ} {
					for _, m := range batch {
						m.ID = ""
					}
					if err := br.Publish(ctx, q, batch...); err != nil {
						b.Fatal(err)
					}
				}
			}
			rawStream, _ := br.StreamNames(rawQ)
			cons, err := js.Consumer(ctx, rawStream, "berth")
			if err != nil {
				b.Fatal(err)
			}
			var rawT, berthT time.Duration
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(benchRound, b.N-done)
				start := time.Now()
				for got := 0; got < n; {
					batch, err := cons.FetchNoWait(min(benchWindow, n-got))
					if err != nil {
						b.Fatal(err)
					}
					for m := range batch.Messages() {
						if mode == "async" {
							err = m.Ack()
						} else {
							err = m.DoubleAck(ctx)
						}
						if err != nil {
							b.Fatal(err)
						}
						got++
					}
				}
				rawT += time.Since(start)

				start = time.Now()
				for got := 0; got < n; {
					ds, err := br.Receive(ctx, berthQ, min(benchWindow, n-got))
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

// rawJS returns a raw nats.go JetStream context on a connection of its own.
func rawJS(b *testing.B) natsjs.JetStream {
	b.Helper()
	nc, err := nats.Connect(integration.NATSURL(b), nats.Name("berth-bench-raw"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := natsjs.New(nc, natsjs.WithPublishAsyncMaxPending(4*slidingWindow))
	if err != nil {
		b.Fatal(err)
	}
	return js
}

// rawPublish publishes n messages with publish acks, benchWindow at a time,
// each with a Nats-Msg-Id and the fields berth carries (type, correlation
// ID) as plain NATS headers, as an application without berth would.
func rawPublish(b *testing.B, js natsjs.JetStream, subject string, n int) {
	b.Helper()
	body := make([]byte, benchBody)
	futs := make([]natsjs.PubAckFuture, 0, benchWindow)
	for sent := 0; sent < n; {
		futs = futs[:0]
		for ; len(futs) < benchWindow && sent < n; sent++ {
			id := sdk.NewID()
			m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{"Type": {"bench"}, "Correlation-Id": {id}}}
			f, err := js.PublishMsgAsync(m, natsjs.WithMsgID(id))
			if err != nil {
				b.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatalf("publish ack: %v", err)
			}
		}
	}
}
