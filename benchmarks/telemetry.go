package main

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/internal/otelfloor"
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

// telMode is one telemetry setting: what it wraps the broker in and which
// observers the Worker gets.
type telMode struct {
	name, config string
	setup        func(br sdk.Publisher) (pub sdk.Publisher, obs []sdk.Observer, close func(), err error)
}

func telModes() []telMode {
	withTel := func(br sdk.Publisher, tp trace.TracerProvider) (sdk.Publisher, []sdk.Observer, func(), error) {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		tel, err := telemetry.New(telemetry.Options{TracerProvider: tp, MeterProvider: mp})
		if err != nil {
			return nil, nil, nil, err
		}
		return tel.Publisher(br), []sdk.Observer{tel}, func() {
			_ = tel.Close()
			_ = mp.Shutdown(context.Background())
		}, nil
	}
	sdkTP := func(br sdk.Publisher, s sdktrace.Sampler) (sdk.Publisher, []sdk.Observer, func(), error) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s), sdktrace.WithSyncer(nopExporter{}))
		pub, obs, closeTel, err := withTel(br, tp)
		if err != nil {
			_ = tp.Shutdown(context.Background())
			return nil, nil, nil, err
		}
		return pub, obs, func() { closeTel(); _ = tp.Shutdown(context.Background()) }, nil
	}
	return []telMode{
		{"off", "no telemetry: the broker publishes, the Worker has no Observer", func(br sdk.Publisher) (sdk.Publisher, []sdk.Observer, func(), error) {
			return br, nil, func() {}, nil
		}},
		{"metrics", "telemetry.Observer and Observer.Publisher, SDK MeterProvider (ManualReader, never collected), no-op TracerProvider", func(br sdk.Publisher) (sdk.Publisher, []sdk.Observer, func(), error) {
			return withTel(br, noop.NewTracerProvider())
		}},
		{"ratio", "as metrics, SDK TracerProvider with ParentBased(TraceIDRatioBased(0.01)), syncer to a no-op exporter", func(br sdk.Publisher) (sdk.Publisher, []sdk.Observer, func(), error) {
			return sdkTP(br, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01)))
		}},
		{"on", "as metrics, SDK TracerProvider with AlwaysSample, syncer to a no-op exporter: two recorded spans per message", func(br sdk.Publisher) (sdk.Publisher, []sdk.Observer, func(), error) {
			return sdkTP(br, sdktrace.AlwaysSample())
		}},
		{"floor: the same spans by hand", "no berth telemetry: the OTel SDK (AlwaysSample, no-op exporter) making the same two spans by hand, W3C context injected and extracted, no metrics (telemetry/bench_test.go's floor)", func(br sdk.Publisher) (sdk.Publisher, []sdk.Observer, func(), error) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSyncer(nopExporter{}))
			hand := otelfloor.New(tp.Tracer("floor"), br, "bench")
			return hand, []sdk.Observer{hand}, func() { _ = tp.Shutdown(context.Background()) }, nil
		}},
		{"metrics floor: the same histograms by hand", "no berth telemetry: the OTel SDK MeterProvider (ManualReader, never collected) recording the two histograms berth records per delivery (process duration, claim to ack; the same boundaries) under one attribute set made once, by an Observer written by hand; no counters, no propagation (internal/otelfloor.HandMetered)", func(br sdk.Publisher) (sdk.Publisher, []sdk.Observer, func(), error) {
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			hand, err := otelfloor.NewMetered(mp, "bench", "billing.charge")
			if err != nil {
				return nil, nil, nil, err
			}
			return br, []sdk.Observer{hand}, func() { _ = mp.Shutdown(context.Background()) }, nil
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
	br, err := memory.New(memory.Options{})
	if err != nil {
		return cost{}, err
	}
	defer br.Close()
	pub, obs, closeTel, err := m.setup(br)
	if err != nil {
		return cost{}, err
	}
	defer closeTel()
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

func runTelemetry(ctx context.Context, c config) ([]table, error) {
	modes := telModes()
	n := msgs(c, 50000)
	costs := make([]cost, len(modes))
	for _, m := range modes { // a warm-up round each
		if _, err := telRound(ctx, m, max(n/10, 1)); err != nil {
			return nil, fmt.Errorf("%s: warm-up: %w", m.name, err)
		}
	}
	for r := range c.rounds {
		for k := range modes {
			i := (k + r) % len(modes)
			got, err := telRound(ctx, modes[i], n)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", modes[i].name, err)
			}
			costs[i].add(got)
		}
	}
	off, metrics, on, floor, mfloor := costs[0], costs[1], costs[3], costs[4], costs[5]
	signed := func(ns float64) string { return fmt.Sprintf("%+.2f µs", ns/1e3) }
	var rs [][]string
	for i, m := range modes {
		c := costs[i]
		rs = append(rs, []string{m.name, rateStr(float64(c.msgs) / c.wall.Seconds()), fmt.Sprintf("%.2f µs", c.cpuPerMsg()/1e3), fmt.Sprintf("%.1f", c.allocsPerMsg()),
			signed(c.cpuPerMsg() - off.cpuPerMsg()), fmt.Sprintf("%+.1f", c.allocsPerMsg()-off.allocsPerMsg()), m.config})
	}
	rs = append(rs, []string{"**on − floor**: berth's own cost of tracing and metrics", "", "", "",
		"**" + signed(on.cpuPerMsg()-floor.cpuPerMsg()) + "**", fmt.Sprintf("**%+.1f**", on.allocsPerMsg()-floor.allocsPerMsg()), "aim ≤ 1 µs, ≤ 6 allocations"})
	rs = append(rs, []string{"**metrics − metrics floor**: berth's own cost of metrics", "", "", "",
		"**" + signed(metrics.cpuPerMsg()-mfloor.cpuPerMsg()) + "**", fmt.Sprintf("**%+.1f**", metrics.allocsPerMsg()-mfloor.allocsPerMsg()), "aim ≤ 1 µs, ≤ 4 allocations"})
	return []table{{
		title: "Telemetry cost per message (memory broker, publish + consume)",
		intro: fmt.Sprintf("%d messages a round per mode, modes in alternating rounds; one goroutine publishes through the mode's publisher, then a Worker of Concurrency 4 (heartbeats off, no-op handler) consumes. CPU is process CPU time (getrusage) per message, GC included; allocations are heap allocations (runtime.MemStats.Mallocs) per message. Aims (issue 19), each berth's own cost above the OTel SDK floor: on − floor ≤ 1 µs and ≤ 6 allocations; metrics − metrics floor ≤ 1 µs and ≤ 4 allocations (the columns “vs off” show metrics with the SDK's own Records included).", n),
		head:  []string{"mode", "msgs/s", "CPU/msg", "allocs/msg", "CPU vs off", "allocs vs off", "configuration"},
		rows:  rs,
	}}, nil
}
