package telemetry_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// nopExporter drops every span: the benchmark measures berth and the OTel
// SDK's span pipeline, not an exporter.
type nopExporter struct{}

func (nopExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (nopExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkWorker publishes b.N messages and consumes them with a Worker on
// the memory broker, without telemetry ("off") and with tracing (always
// sample, no-op exporter) and metrics (a ManualReader never collected) on
// ("on"), and with metrics and header propagation but a no-op tracer
// ("metrics"), to show what the spans cost. ns/op and allocs/op are per message, publish and consume together.
func BenchmarkWorker(b *testing.B) {
	for _, mode := range []string{"off", "metrics", "on"} {
		b.Run(mode, func(b *testing.B) {
			br, err := memory.New(memory.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			var (
				pub       sdk.Publisher = br
				observers []sdk.Observer
			)
			if mode != "off" {
				var tp trace.TracerProvider = noop.NewTracerProvider()
				if mode == "on" {
					sdktp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSyncer(nopExporter{}))
					defer sdktp.Shutdown(context.Background())
					tp = sdktp
				}
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				defer mp.Shutdown(context.Background())
				tel, err := telemetry.New(telemetry.Options{TracerProvider: tp, MeterProvider: mp})
				if err != nil {
					b.Fatal(err)
				}
				defer tel.Close()
				pub, observers = tel.Publisher(br), []sdk.Observer{tel}
			}
			queue := "bench"
			var handled atomic.Int64
			done := make(chan struct{})
			n := int64(b.N)
			w, err := sdk.NewWorker(br, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
				if handled.Add(1) == n {
					close(done)
				}
				return nil
			}), sdk.WorkerOptions{Queue: queue, Concurrency: 4, HeartbeatInterval: -1, Observers: observers, Logger: discard})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			msgs := make([]sdk.Message, b.N)
			for i := range msgs {
				msgs[i] = sdk.Message{Type: "billing.charge", Body: []byte(`{"order":"order_123"}`)}
				if err := pub.Publish(ctx, queue, &msgs[i]); err != nil {
					b.Fatal(err)
				}
			}
			ran := make(chan error, 1)
			go func() { ran <- w.Run(ctx) }()
			<-done
			cancel()
			if err := <-ran; err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}
