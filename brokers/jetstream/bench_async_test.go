package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// slidingWindow is the acks outstanding in BenchmarkPublishAsync, both sides.
const slidingWindow = 256

// BenchmarkPublishAsync compares one goroutine publishing through berth's
// PublishAsync (MaxInFlight 256) with raw nats.go PublishMsgAsync keeping a
// sliding window of 256 acks (waiting for the oldest only when full), with
// the same headers as rawPublish, in alternating rounds.
func BenchmarkPublishAsync(b *testing.B) {
	br := newBroker(b, jetstream.Options{Logger: quiet, MaxInFlight: slidingWindow})
	berthQ, rawQ := declare(b, br, "bench"), declare(b, br, "benchraw")
	rawSubject := br.Subject(rawQ)
	js := rawJS(b)
	ctx := context.Background()
	body := make([]byte, benchBody)
	results := make([]*sdk.PublishResult, 0, benchRound)
	var rawT, berthT time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(benchRound, b.N-done)
		start := time.Now()
		rawSliding(b, js, rawSubject, n)
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
}

// rawSliding publishes n messages like rawPublish, keeping up to
// slidingWindow acks outstanding.
func rawSliding(b *testing.B, js natsjs.JetStream, subject string, n int) {
	b.Helper()
	body := make([]byte, benchBody)
	ring := make([]natsjs.PubAckFuture, 0, slidingWindow)
	head := 0
	wait := func(f natsjs.PubAckFuture) {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatalf("publish ack: %v", err)
		}
	}
	for range n {
		if len(ring) == slidingWindow {
			wait(ring[head])
		}
		id := sdk.NewID()
		m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{"Type": {"bench"}, "Correlation-Id": {id}}}
		f, err := js.PublishMsgAsync(m, natsjs.WithMsgID(id))
		if err != nil {
			b.Fatal(err)
		}
		if len(ring) < slidingWindow {
			ring = append(ring, f)
		} else {
			ring[head] = f
			head = (head + 1) % slidingWindow
		}
	}
	for _, f := range ring {
		wait(f)
	}
}
