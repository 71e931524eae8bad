package memory_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// benchConcurrency is the number of handler goroutines on both sides.
const benchConcurrency = 16

// benchBatch is how many messages the producer publishes per call.
const benchBatch = 100

// channelRate is the msgs/s of the channel baseline, measured by the
// "channel" sub-benchmark just before the berth ones so they can report
// their ratio to it.
var channelRate float64

// BenchmarkWorkerVsChannel runs, side by side, b.N messages through
//
//   - channel: a buffered Go channel (capacity Concurrency+Prefetch, as the
//     Worker's) feeding benchConcurrency goroutines that call a no-op handler;
//   - worker: sdk.Worker with Concurrency benchConcurrency and a no-op handler
//     on the memory broker, while a producer publishes in batches of
//     benchBatch;
//   - worker-prepublished: the same Worker, with the b.N messages published
//     before the timer starts (the consume side alone);
//   - broker, broker-prepublished: the same two without a Worker (see
//     benchBroker), the ceiling of any Worker on this broker.
//
// Each reports msgs/s and cpu-ns/msg (process CPU time per message); the
// berth ones also report x-channel, their rate divided by the channel's.
// allocs/op is allocations per message.
func BenchmarkWorkerVsChannel(b *testing.B) {
	b.Run("channel", benchChannel)
	b.Run("worker", func(b *testing.B) { benchWorker(b, false, 0) })
	b.Run("worker-backlog", func(b *testing.B) { benchWorker(b, false, benchBacklog) })
	b.Run("worker-prepublished", func(b *testing.B) { benchWorker(b, true, 0) })
	b.Run("broker", func(b *testing.B) { benchBroker(b, false, 0) })
	b.Run("broker-backlog", func(b *testing.B) { benchBroker(b, false, benchBacklog) })
	b.Run("broker-prepublished", func(b *testing.B) { benchBroker(b, true, 0) })
}

// benchBroker is the broker alone, without the Worker: benchConcurrency
// goroutines each Receive up to benchReceive deliveries and Ack them, while
// a producer publishes in batches of benchBatch (as for worker) or on
// messages published before the timer (prepublish). The end-to-end figure
// bounds what any Worker design on this broker could reach: the Worker
// adds its own work to the broker's, never takes from it.
func benchBroker(b *testing.B, prepublish bool, backlog int) {
	br := newBroker(b, memory.Options{MaxBacklog: backlog})
	const queue = "bench"
	if prepublish {
		publishBench(b, br, queue, b.N)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var left atomic.Int64
	left.Store(int64(b.N))
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime(b)
	var producer sync.WaitGroup
	if !prepublish {
		producer.Go(func() { publishBench(b, br, queue, b.N) })
	}
	var wg sync.WaitGroup
	for range benchConcurrency {
		wg.Go(func() {
			for {
				ds, err := br.Receive(ctx, queue, benchReceive)
				if err != nil {
					return // cancelled: all acked
				}
				for _, d := range ds {
					if err := d.Ack(ctx); err != nil {
						b.Error(err)
					}
				}
				if left.Add(-int64(len(ds))) == 0 {
					cancel()
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/msg")
	producer.Wait()
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, "msgs/s")
	if channelRate > 0 {
		b.ReportMetric(rate/channelRate, "x-channel")
	}
}

// benchBacklog is the MaxBacklog of the -backlog variants.
var benchBacklog = 1024

// benchReceive is the max of each Receive of the broker-only benchmark.
const benchReceive = 32

// publishBench publishes n small messages to queue in batches of benchBatch.
func publishBench(b *testing.B, br *memory.Broker, queue string, n int) {
	ctx := context.Background()
	batch := make([]*sdk.Message, 0, benchBatch)
	for i := 0; i < n; {
		batch = batch[:0]
		for ; i < n && len(batch) < benchBatch; i++ {
			batch = append(batch, &sdk.Message{Type: "bench", Body: []byte("{}")})
		}
		if err := br.Publish(ctx, queue, batch...); err != nil {
			b.Error(err)
			return
		}
	}
}

type benchJob struct {
	id   int
	body []byte
}

func benchChannel(b *testing.B) {
	b.ReportAllocs()
	handler := func(context.Context, *benchJob) error { return nil }
	jobs := make(chan *benchJob, 2*benchConcurrency)
	var done sync.WaitGroup
	ctx := context.Background()
	start, cpu0 := time.Now(), cpuTime(b)
	b.ResetTimer()
	for range benchConcurrency {
		done.Go(func() {
			for j := range jobs {
				_ = handler(ctx, j)
			}
		})
	}
	body := []byte("{}")
	for i := range b.N {
		jobs <- &benchJob{id: i, body: body}
	}
	close(jobs)
	done.Wait()
	b.StopTimer()
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/msg")
	channelRate = float64(b.N) / time.Since(start).Seconds()
	b.ReportMetric(channelRate, "msgs/s")
}

// acks counts acknowledged deliveries and signals when it reaches want.
type acks struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (a *acks) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (a *acks) Settled(_ context.Context, _ sdk.Delivery, s sdk.Settlement) {
	if s.Action == sdk.ActionAck && s.Err == nil && a.n.Add(1) == a.want {
		close(a.done)
	}
}

func benchWorker(b *testing.B, prepublish bool, backlog int) {
	br := newBroker(b, memory.Options{MaxBacklog: backlog})
	const queue = "bench"
	publish := func(n int) { publishBench(b, br, queue, n) }
	if prepublish {
		publish(b.N)
	}
	obs := &acks{want: int64(b.N), done: make(chan struct{})}
	w, err := sdk.NewWorker(br, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{
			Queue:       queue,
			Concurrency: benchConcurrency,
			Observers:   []sdk.Observer{obs},
			Logger:      slog.New(slog.DiscardHandler),
		})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime(b)
	go func() { errc <- w.Run(ctx) }()
	var producer sync.WaitGroup
	if !prepublish {
		producer.Go(func() { publish(b.N) })
	}
	<-obs.done
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/msg")
	producer.Wait()
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, "msgs/s")
	if channelRate > 0 {
		b.ReportMetric(rate/channelRate, "x-channel")
	}
}

// cpuTime is the CPU time (user + system) the process has used. Per
// message it is steadier than wall time on a machine shared with other
// work, which takes the CPUs away from the goroutines of one side or the
// other.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
