package telemetry_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// The publisher writes the trace context into the message headers and fills
// the correlation ID from the context; the Worker's observer puts it back in
// the handler's context, and the log handler adds it to every record.
func Example() {
	b, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	tel, err := telemetry.New(telemetry.Options{TracerProvider: tp})
	if err != nil {
		panic(err)
	}
	defer tel.Close()

	ctx := sdk.WithCorrelationID(context.Background(), "order_123")
	m := &sdk.Message{Type: "billing.charge", Body: []byte(`{"order":"order_123"}`)}
	if err := tel.Publisher(b).Publish(ctx, "billing", m); err != nil {
		panic(err)
	}
	keys := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fmt.Println("headers:", keys, "correlation:", m.CorrelationID)

	// Log without time, trace and span IDs, so that the output is stable.
	logger := slog.New(telemetry.NewLogHandler(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.TimeKey, telemetry.LogTraceID, telemetry.LogSpanID:
				return slog.Attr{}
			}
			return a
		},
	})))
	wctx, stop := context.WithCancel(context.Background())
	w, err := sdk.NewWorker(b, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		logger.InfoContext(ctx, "charging")
		stop()
		return nil
	}), sdk.WorkerOptions{Queue: "billing", Observers: []sdk.Observer{tel}, Logger: slog.New(slog.DiscardHandler), DrainTimeout: time.Second})
	if err != nil {
		panic(err)
	}
	if err := w.Run(wctx); err != nil {
		panic(err)
	}
	// Output:
	// headers: [traceparent] correlation: order_123
	// level=INFO msg=charging correlation_id=order_123 job_type=billing.charge attempt=1
}
