package ledger_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// counter counts acks and says when a round's last one came.
type counter struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (c *counter) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }
func (c *counter) Settled(_ context.Context, _ sdk.Delivery, s sdk.Settlement) {
	if s.Action == sdk.ActionAck && c.n.Add(1) == c.want {
		close(c.done)
	}
}

// BenchmarkConsumeRabbitMQ compares a Worker consuming RabbitMQ with the
// ledger off and on (the ledger's Observer recording each start and
// settlement), in alternating rounds of 2,000 256-byte messages so that
// load from other processes hits both alike. Each round publishes its
// messages first (through the ledger's Publisher when on, so the rows exist
// as in production), then times a fresh Worker (Concurrency 16) until the
// last ack and, when on, until the ledger has written the round. It
// reports both rates and "on/off"; "on/off_acked" stops the on clock at the
// last ack (what the jobs see); and the ledger's write lag (record to batch
// written): mean and max over the run.
//
// store=postgres writes to pgledger.Store on the same machine;
// store=discard writes nowhere, which isolates the ledger's in-process cost
// from PostgreSQL's CPU; writers=N writes N batches at once.
func BenchmarkConsumeRabbitMQ(b *testing.B) {
	b.Run("store=postgres", func(b *testing.B) { benchConsume(b, rabbitEnv(b)) })
	for _, w := range []int{2, 4} {
		b.Run(fmt.Sprintf("store=postgres,writers=%d", w), func(b *testing.B) {
			e := rabbitEnv(b)
			e.led = newLedger(b, e.reader.(ledger.Store), ledger.Options{Writers: w})
			benchConsume(b, e)
		})
	}
	b.Run("store=discard", func(b *testing.B) {
		e := rabbitEnv(b)
		e.led = newLedger(b, discard{}, ledger.Options{})
		benchConsume(b, e)
	})
}

// discard is a Store that writes nowhere.
type discard struct{}

func (discard) Write(context.Context, []ledger.Event) error { return nil }

func benchConsume(b *testing.B, e env) {
	ctx := context.Background()
	body := make([]byte, 256)
	const round = 2000
	var offT, onT, onAckT time.Duration
	var offN, onN int
	run := func(on bool, n int) (acked, written time.Duration) {
		pub := sdk.Publisher(e.b)
		if on {
			pub = e.led.Publisher(e.b)
		}
		for sent := 0; sent < n; sent += 100 {
			msgs := make([]*sdk.Message, min(100, n-sent))
			for i := range msgs {
				msgs[i] = &sdk.Message{Type: "bench", Body: body}
			}
			if err := pub.Publish(ctx, e.queue, msgs...); err != nil {
				b.Fatal(err)
			}
		}
		if on {
			if err := e.led.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
		c := &counter{want: int64(n), done: make(chan struct{})}
		obs := []sdk.Observer{c}
		if on {
			obs = append(obs, e.led)
		}
		w, err := sdk.NewWorker(e.b, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
			sdk.WorkerOptions{Queue: e.queue, Concurrency: 16, Observers: obs, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- w.Run(wctx) }()
		select {
		case <-c.done:
		case <-time.After(2 * time.Minute):
			b.Fatalf("%d of %d acked", c.n.Load(), n)
		}
		acked = time.Since(start)
		// The round is over when the ledger has written it too: a writer
		// that falls behind must not pass its work on to the next round.
		if on {
			if err := e.led.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
		written = time.Since(start)
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		return acked, written
	}
	b.ResetTimer()
	for done, i := 0, 0; done < b.N; i++ {
		n := min(round, b.N-done)
		// Alternate which goes first, so neither always follows the other.
		for _, on := range []bool{i%2 == 0, i%2 != 0} {
			acked, written := run(on, n)
			if on {
				onT, onAckT, onN = onT+written, onAckT+acked, onN+n
			} else {
				offT, offN = offT+acked, offN+n
			}
		}
		done += n
	}
	b.StopTimer()
	if err := e.led.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	s := e.led.Stats()
	if s.Dropped != 0 || s.Failed != 0 {
		b.Errorf("ledger %+v: the benchmark must not drop or fail", s)
	}
	off, on := float64(offN)/offT.Seconds(), float64(onN)/onT.Seconds()
	b.ReportMetric(off, "off_msgs/s")
	b.ReportMetric(on, "on_msgs/s")
	b.ReportMetric(on/off, "on/off")
	b.ReportMetric(float64(onN)/onAckT.Seconds()/off, "on/off_acked")
	b.ReportMetric(float64(s.MeanLag.Microseconds())/1000, "lag_mean_ms")
	b.ReportMetric(float64(s.MaxLag.Microseconds())/1000, "lag_max_ms")
	b.ReportMetric(float64(s.Written)/float64(max(s.Batches, 1)), "events/batch")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkRecord is Record's own cost with a writer that keeps up (a
// store that writes nowhere): serial, and from GOMAXPROCS goroutines at
// once.
func BenchmarkRecord(b *testing.B) {
	e := ledger.Event{MessageID: "m", Queue: "q", Status: ledger.StatusEnqueued, At: time.Now()}
	b.Run("serial", func(b *testing.B) {
		l := newLedger(b, discard{}, ledger.Options{})
		b.ReportAllocs()
		for b.Loop() {
			l.Record(e)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		l := newLedger(b, discard{}, ledger.Options{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Record(e)
			}
		})
	})
}
