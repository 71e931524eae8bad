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
)

// BenchmarkPublish publishes 256-byte persistent messages with confirms, a
// window of 100, through berth and through raw amqp091-go, for both queue
// types. msgs/s is the figure to compare.
func BenchmarkPublish(b *testing.B) {
	for _, qt := range []QueueType{Classic, Quorum} {
		b.Run(string(qt)+"/raw", func(b *testing.B) { benchPublishRaw(b, qt) })
		b.Run(string(qt)+"/berth", func(b *testing.B) { benchPublishBerth(b, qt) })
	}
}

// BenchmarkConsume consumes and acks 256-byte messages one by one with a
// prefetch of 100, through berth (Receive + Ack) and through raw amqp091-go
// (Consume + Ack), for both queue types.
func BenchmarkConsume(b *testing.B) {
	for _, qt := range []QueueType{Classic, Quorum} {
		b.Run(string(qt)+"/raw", func(b *testing.B) { benchConsumeRaw(b, qt) })
		b.Run(string(qt)+"/berth", func(b *testing.B) { benchConsumeBerth(b, qt) })
	}
}

// benchQueue declares a fresh queue of type qt (with berth's topology, so
// both sides publish to the same kind of queue) and returns a broker for it.
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

func rawChannel(b *testing.B, url string) *amqp.Channel {
	b.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	return ch
}

// rawPublish publishes n messages with confirms, window at a time.
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

func benchPublishRaw(b *testing.B, qt QueueType) {
	_, url, q := benchQueue(b, qt)
	ch := rawChannel(b, url)
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	b.ResetTimer()
	rawPublish(b, ch, q, b.N)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

func benchPublishBerth(b *testing.B, qt QueueType) {
	br, _, q := benchQueue(b, qt)
	ctx := context.Background()
	body := make([]byte, benchBody)
	msgs := make([]*sdk.Message, benchWindow)
	start := time.Now()
	b.ResetTimer()
	for sent := 0; sent < b.N; {
		batch := msgs[:min(benchWindow, b.N-sent)]
		for i := range batch {
			batch[i] = &sdk.Message{Type: "bench", Body: body}
		}
		if err := br.Publish(ctx, q, batch...); err != nil {
			b.Fatal(err)
		}
		sent += len(batch)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

func benchConsumeRaw(b *testing.B, qt QueueType) {
	_, url, q := benchQueue(b, qt)
	pub := rawChannel(b, url)
	if err := pub.Confirm(false); err != nil {
		b.Fatal(err)
	}
	rawPublish(b, pub, q, b.N)
	ch := rawChannel(b, url)
	if err := ch.Qos(benchPrefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	b.ResetTimer()
	dels, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		d := <-dels
		if err := d.Ack(false); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

func benchConsumeBerth(b *testing.B, qt QueueType) {
	br, url, q := benchQueue(b, qt)
	pub := rawChannel(b, url)
	if err := pub.Confirm(false); err != nil {
		b.Fatal(err)
	}
	rawPublish(b, pub, q, b.N)
	ctx := context.Background()
	start := time.Now()
	b.ResetTimer()
	for got := 0; got < b.N; {
		ds, err := br.Receive(ctx, q, benchPrefetch)
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
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
