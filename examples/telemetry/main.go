// Command telemetry runs a short billing flow on the in-memory broker with
// berth's telemetry on, then prints the traces it recorded and every metric,
// as an operator's dashboard would see them.
//
// The flow: a checkout publishes one "billing.charge" job per order, under a
// correlation ID; a Worker charges each order once (a duplicate publish is
// suppressed by the idempotency guard, a flaky payment gateway makes some
// charges retry, an order that does not exist is dead-lettered) and publishes
// an "email.receipt" job for each charge, which carries the same correlation
// ID and continues the same trace. Logs go through telemetry.LogHandler, so
// every line has correlation_id, trace_id, span_id, job_type and attempt.
//
//	go run ./examples/telemetry
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

const (
	orders     = 8
	billing    = "billing"
	email      = "email"
	missingOrd = "order_404"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "telemetry example:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	// The application's OpenTelemetry SDK: spans to memory, metrics read on demand.
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	broker, err := memory.New(memory.Options{Lease: 5 * time.Second})
	if err != nil {
		return err
	}
	defer broker.Close()
	tel, err := telemetry.New(telemetry.Options{
		TracerProvider: tp,
		MeterProvider:  mp,
		Queues:         []telemetry.InspectedQueue{{Inspector: broker, Queue: billing}, {Inspector: broker, Queue: email}},
	})
	if err != nil {
		return err
	}
	defer tel.Close()
	pub := tel.Publisher(broker)
	logger := slog.New(telemetry.NewLogHandler(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})))

	// The checkout: one charge per order, order_1 published twice, and an
	// order that does not exist.
	checkout, root := tp.Tracer("checkout").Start(sdk.WithCorrelationID(ctx, "checkout-7f3a"), "checkout")
	ids := []string{missingOrd, "order_1"}
	for i := 1; i <= orders; i++ {
		ids = append(ids, fmt.Sprintf("order_%d", i))
	}
	for _, id := range ids {
		m := &sdk.Message{Type: "billing.charge", IdempotencyKey: "charge:" + id + ":v1", Body: []byte(id)}
		if err := pub.Publish(checkout, billing, m); err != nil {
			return err
		}
	}
	root.End()

	// The billing worker.
	var settled atomic.Int64
	// The idempotency guard acks the duplicate of order_1 without charging
	// again, and reports it (and every other guard event) to telemetry.
	guard, err := idempotency.New(idempotency.Options{
		Store:    memstore.New(memstore.Options{}),
		Observer: tel.Idempotency(),
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return err
	}
	charge := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		m := d.Message()
		order := string(m.Body)
		if order == missingOrd {
			return sdk.Permanent(fmt.Errorf("order %s does not exist", order))
		}
		if d.Attempt() == 1 && strings.HasSuffix(order, "3") || strings.HasSuffix(order, "6") && d.Attempt() < 3 {
			return errors.New("payment gateway timeout")
		}
		logger.InfoContext(ctx, "charged", "order", order)
		return pub.Publish(ctx, email, &sdk.Message{Type: "email.receipt", IdempotencyKey: "email:receipt:" + order, Body: m.Body})
	})
	mail := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		logger.InfoContext(ctx, "receipt sent", "order", string(d.Message().Body))
		return nil
	})
	count := (*settledCounter)(&settled)
	// Deliveries: every publish, plus the retries (order_3 once, order_6 twice).
	want := int64(len(ids) + 3 + orders)

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	retry := sdk.RetryPolicy{MaxAttempts: 4, Backoff: sdk.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}}
	workerLog := slog.New(slog.DiscardHandler)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for queue, h := range map[string]sdk.Handler{billing: charge, email: mail} {
		// One billing handler at a time, so that the duplicate of order_1
		// finds it completed rather than in progress (which the guard would
		// hand back for later: safe, but the counts below would vary).
		concurrency, mws := 4, []sdk.Middleware(nil)
		if queue == billing {
			concurrency, mws = 1, []sdk.Middleware{guard.Middleware()}
		}
		w, err := sdk.NewWorker(broker, h, sdk.WorkerOptions{
			Queue: queue, Concurrency: concurrency, Retry: retry, Logger: workerLog, Middleware: mws,
			Observers: []sdk.Observer{tel, count},
		})
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- w.Run(wctx)
		}()
	}
	deadline := time.After(20 * time.Second)
	for settled.Load() < want {
		select {
		case <-deadline:
			stop()
			wg.Wait()
			return fmt.Errorf("only %d of %d deliveries settled", settled.Load(), want)
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}

	printTraces(spans.GetSpans())
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	printMetrics(rm)
	return nil
}

// settledCounter is an Observer counting settlements, so run knows when the
// flow is over.
type settledCounter atomic.Int64

func (c *settledCounter) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (c *settledCounter) Settled(context.Context, sdk.Delivery, sdk.Settlement) {
	(*atomic.Int64)(c).Add(1)
}

// printTraces prints each trace as a tree: parent spans above their children.
func printTraces(spans tracetest.SpanStubs) {
	children := map[trace.SpanID][]tracetest.SpanStub{}
	known := map[trace.SpanID]bool{}
	traces := map[trace.TraceID]bool{}
	for _, s := range spans {
		known[s.SpanContext.SpanID()] = true
		traces[s.SpanContext.TraceID()] = true
	}
	var roots []tracetest.SpanStub
	for _, s := range spans {
		if p := s.Parent.SpanID(); s.Parent.IsValid() && known[p] {
			children[p] = append(children[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	fmt.Printf("\n== traces: %d spans in %d trace(s)\n", len(spans), len(traces))
	var walk func(s tracetest.SpanStub, depth int)
	walk = func(s tracetest.SpanStub, depth int) {
		line := strings.Repeat("  ", depth) + s.Name
		for _, a := range s.Attributes {
			switch a.Key {
			case "messaging.message.conversation_id", "berth.delivery.attempt", "berth.settlement.action", "error.type", "berth.retry.delay":
				line += fmt.Sprintf(" %s=%s", a.Key, a.Value.String())
			}
		}
		fmt.Println(line)
		kids := children[s.SpanContext.SpanID()]
		sort.Slice(kids, func(i, j int) bool { return kids[i].StartTime.Before(kids[j].StartTime) })
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		fmt.Printf("trace %s\n", r.SpanContext.TraceID())
		walk(r, 1)
	}
}

func printMetrics(rm metricdata.ResourceMetrics) {
	fmt.Println("\n== metrics")
	for _, sm := range rm.ScopeMetrics {
		ms := sm.Metrics
		sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
		for _, m := range ms {
			fmt.Printf("%s (%s)\n", m.Name, m.Unit)
			var lines []string
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("  %-6d %s", p.Value, attrs(p.Attributes)))
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("  %-6d %s", p.Value, attrs(p.Attributes)))
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("  %-6.3f %s", p.Value, attrs(p.Attributes)))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("  count=%d sum=%.6fs %s", p.Count, p.Sum, attrs(p.Attributes)))
				}
			}
			sort.Strings(lines)
			fmt.Println(strings.Join(lines, "\n"))
		}
	}
}

// attrs prints a set without messaging.system, the same on every line here.
func attrs(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		if kv.Key == "messaging.system" {
			continue
		}
		parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
	}
	return strings.Join(parts, " ")
}
