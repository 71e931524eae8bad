package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/propagation"

	"github.com/berthq/berth/sdk"
)

// DefaultPropagator is the propagator used when [Options.Propagator] is nil:
// W3C trace context and W3C baggage.
var DefaultPropagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(
	propagation.TraceContext{}, propagation.Baggage{})

// Inject writes the trace context and baggage of ctx into m's headers with
// prop (nil means [DefaultPropagator]). It replaces m.Headers by a copy first,
// so a header map shared by several messages is never written to. A
// "tracestate" m carried goes when a new "traceparent" is written: it belongs
// to the old one (W3C Trace Context). It does not touch m.CorrelationID.
func Inject(ctx context.Context, prop propagation.TextMapPropagator, m *sdk.Message) {
	if prop == nil {
		prop = DefaultPropagator
	}
	buf := getStartBuf()
	prop.Inject(ctx, &buf.carrier)
	m.Headers = buf.carrier.merge(m.Headers, true)
	startBufs.Put(buf)
}

// Extract returns ctx with the remote span context and the baggage found in
// m's headers, using prop (nil means [DefaultPropagator]). A message without
// trace headers gives ctx unchanged.
func Extract(ctx context.Context, prop propagation.TextMapPropagator, m *sdk.Message) context.Context {
	if prop == nil {
		prop = DefaultPropagator
	}
	if len(m.Headers) == 0 {
		return ctx
	}
	return prop.Extract(ctx, propagation.MapCarrier(m.Headers))
}
