package main

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// The telemetry scenario measures what berth's telemetry package adds per
// message, publish and consume together, on the memory broker (so that the
// broker costs little): process CPU time (getrusage, steadier than wall time
// on a shared machine) and heap allocations (runtime.MemStats.Mallocs) per
// message, modes in alternating rounds in one process. The floor is the
// OpenTelemetry SDK alone recording the two spans berth records per message.

// nopExporter drops every span: the figures are berth's and the SDK's span
// pipeline, not an exporter's.
type nopExporter struct{}

func (nopExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (nopExporter) Shutdown(context.Context) error                             { return nil }

// telMode is one telemetry setting: how to wrap the broker and which
// observers the Worker gets.
type telMode struct {
	name, config string
	setup        func() (pub func(sdk.Publisher) sdk.Publisher, obs []sdk.Observer, close func(), err error)
}

func telModes() []telMode {
	withTel := func(tp trace.TracerProvider) (func(sdk.Publisher) sdk.Publisher, []sdk.Observer, func(), error) {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		tel, err := telemetry.New(telemetry.Options{TracerProvider: tp, MeterProvider: mp})
		if err != nil {
			return nil, nil, nil, err
		}
		return func(p sdk.Publisher) sdk.Publisher { return tel.Publisher(p) }, []sdk.Observer{tel}, func() {
			_ = tel.Close()
			_ = mp.Shutdown(context.Background())
		}, nil
	}
	sdkTP := func(s sdktrace.Sampler) (func(sdk.Publisher) sdk.Publisher, []sdk.Observer, func(), error) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s), sdktrace.WithSyncer(nopExporter{}))
		pub, obs, closeTel, err := withTel(tp)
		if err != nil {
			_ = tp.Shutdown(context.Background())
			return nil, nil, nil, err
		}
		return pub, obs, func() { closeTel(); _ = tp.Shutdown(context.Background()) }, nil
	}
	return []telMode{
		{"off", "no telemetry: the broker publishes, the Worker has no Observer", func() (func(sdk.Publisher) sdk.Publisher, []sdk.Observer, func(), error) {
			return func(p sdk.Publisher) sdk.Publisher { return p }, nil, func() {}, nil
		}},
		{"metrics", "telemetry.Observer and Observer.Publisher, SDK MeterProvider (ManualReader, never collected), no-op TracerProvider", func() (func(sdk.Publisher) sdk.Publisher, []sdk.Observer, func(), error) {
			return withTel(noop.NewTracerProvider())
		}},
		{"ratio", "as metrics, SDK TracerProvider with ParentBased(TraceIDRatioBased(0.01)), syncer to a no-op exporter", func() (func(sdk.Publisher) sdk.Publisher, []sdk.Observer, func(), error) {
			return sdkTP(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01)))
		}},
		{"on", "as metrics, SDK TracerProvider with AlwaysSample, syncer to a no-op exporter: two recorded spans per message", func() (func(sdk.Publisher) sdk.Publisher, []sdk.Observer, func(), error) {
			return sdkTP(sdktrace.AlwaysSample())
		}},
	}
}

// cost is what a round used.
type cost struct {
	wall, cpu time.Duration
	mallocs   uint64
	msgs      int
}

func (c *cost) add(o cost) {
	c.wall += o.wall
	c.cpu += o.cpu
	c.mallocs += o.mallocs
	c.msgs += o.msgs
}

func (c cost) cpuPerMsg() float64    { return float64(c.cpu.Nanoseconds()) / float64(c.msgs) }
func (c cost) allocsPerMsg() float64 { return float64(c.mallocs) / float64(c.msgs) }

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure runs f and returns its wall time, process CPU time and heap
// allocations.
func measure(msgs int, f func() error) (cost, error) {
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start, cpu0 := time.Now(), processCPU()
	err := f()
	wall, cpu := time.Since(start), processCPU()-cpu0
	runtime.ReadMemStats(&m1)
	return cost{wall: wall, cpu: cpu, mallocs: m1.Mallocs - m0.Mallocs, msgs: msgs}, err
}

// telRound publishes n messages through the mode's publisher and consumes
// them with a Worker (Concurrency 4, heartbeats off, no-op handler).
func telRound(ctx context.Context, m telMode, n int) (cost, error) {
	wrap, obs, closeTel, err := m.setup()
	if err != nil {
		return cost{}, err
	}
	defer closeTel()
	br, err := memory.New(memory.Options{})
	if err != nil {
		return cost{}, err
	}
	defer br.Close()
	pub := wrap(br)
	var handled atomic.Int64
	done := make(chan struct{})
	w, err := sdk.NewWorker(br, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
		if handled.Add(1) == int64(n) {
			close(done)
		}
		return nil
	}), sdk.WorkerOptions{Queue: "bench", Concurrency: 4, HeartbeatInterval: -1, Observers: obs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return cost{}, err
	}
	return measure(n, func() error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		for range n {
			if err := pub.Publish(ctx, "bench", &sdk.Message{Type: "billing.charge", Body: []byte(`{"order":"order_123"}`)}); err != nil {
				return err
			}
		}
		ran := make(chan error, 1)
		go func() { ran <- w.Run(ctx) }()
		<-done
		cancel()
		return <-ran
	})
}

// spanFloor records, n times, the two spans berth records per message with
// the same attributes and link, with the OTel SDK alone.
func spanFloor(n int) (cost, error) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSyncer(nopExporter{}))
	defer tp.Shutdown(context.Background())
	tr := tp.Tracer("floor")
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "memory"), attribute.String("messaging.destination.name", "bench"),
		attribute.String("messaging.operation.name", "send"), attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.message.id", "0192b5c8-7f3a-7000-8000-000000000000"),
		attribute.String("messaging.message.conversation_id", "0192b5c8-7f3a-7000-8000-000000000001"),
		attribute.String("berth.job.type", "billing.charge"), attribute.Int("berth.delivery.attempt", 1),
	}
	end := []attribute.KeyValue{attribute.String("berth.settlement.action", "ack")}
	ctx := context.Background()
	return measure(n, func() error {
		for range n {
			pctx, send := tr.Start(ctx, "send bench", trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
			send.End()
			_, proc := tr.Start(pctx, "process bench", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...),
				trace.WithLinks(trace.Link{SpanContext: send.SpanContext()}))
			proc.SetAttributes(end...)
			proc.End()
		}
		return nil
	})
}

func runTelemetry(ctx context.Context, c config) ([]table, error) {
	modes := telModes()
	n := msgs(c, 50000)
	costs := make([]cost, len(modes)+1) // the last: the floor
	// A warm-up round each.
	for _, m := range modes {
		if _, err := telRound(ctx, m, max(n/10, 1)); err != nil {
			return nil, fmt.Errorf("%s: warm-up: %w", m.name, err)
		}
	}
	for r := range c.rounds {
		for k := range len(modes) + 1 {
			i := (k + r) % (len(modes) + 1)
			var got cost
			var err error
			if i == len(modes) {
				got, err = spanFloor(n)
			} else {
				got, err = telRound(ctx, modes[i], n)
			}
			if err != nil {
				return nil, err
			}
			costs[i].add(got)
		}
	}
	off, floor := costs[0], costs[len(modes)]
	us := func(ns float64) string { return fmt.Sprintf("%.2f µs", ns/1e3) }
	signed := func(ns float64) string { return fmt.Sprintf("%+.2f µs", ns/1e3) }
	var rs [][]string
	for i, m := range modes {
		c := costs[i]
		rs = append(rs, []string{m.name, rateStr(float64(c.msgs) / c.wall.Seconds()), us(c.cpuPerMsg()), fmt.Sprintf("%.1f", c.allocsPerMsg()),
			signed(c.cpuPerMsg() - off.cpuPerMsg()), fmt.Sprintf("%+.1f", c.allocsPerMsg()-off.allocsPerMsg()), m.config})
	}
	rs = append(rs, []string{"OTel SDK floor (2 spans, no berth)", "—", us(floor.cpuPerMsg()), fmt.Sprintf("%.1f", floor.allocsPerMsg()), "—", "—",
		"the two spans berth records per message (8 attributes each, a link, 1 more at the end), AlwaysSample, no-op exporter"})
	on := costs[3]
	rs = append(rs, []string{"**on − off − floor** (telemetry's own cost when tracing)", "", "", "",
		"**" + signed(on.cpuPerMsg()-off.cpuPerMsg()-floor.cpuPerMsg()) + "**", fmt.Sprintf("**%+.1f**", on.allocsPerMsg()-off.allocsPerMsg()-floor.allocsPerMsg()), "aim ≤ 1 µs, ≤ 6 allocations"})
	return []table{{
		title: "Telemetry cost per message (memory broker, publish + consume)",
		intro: fmt.Sprintf("%d messages a round per mode, modes and the floor in alternating rounds; a Worker of Concurrency 4 (heartbeats off, no-op handler) consumes what one goroutine published. CPU is process CPU time (getrusage) per message, GC included; allocations are heap allocations (runtime.MemStats.Mallocs) per message. Aims: metrics only ≤ +1 µs and ≤ +4 allocations over off.", n),
		head:  []string{"mode", "msgs/s", "CPU/msg", "allocs/msg", "CPU vs off", "allocs vs off", "configuration"},
		rows:  rs,
	}}, nil
}
