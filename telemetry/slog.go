package telemetry

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"

	"github.com/berthq/berth/sdk"
)

// Keys of the attributes [LogHandler] adds.
const (
	LogCorrelationID = "correlation_id"
	LogTraceID       = "trace_id"
	LogSpanID        = "span_id"
	LogJobType       = "job_type"
	LogAttempt       = "attempt"
)

// LogHandler is a [slog.Handler] that adds, from the record's context, the
// correlation ID ([sdk.CorrelationID]), the trace and span IDs of the current
// span, and — inside a handler run by a Worker with an [Observer] — the job
// type and attempt of the delivery. The correlation ID and job type, which
// come from the message, are written through [sdk.LogText] (valid UTF-8, at
// most [sdk.MaxLogTextLength] bytes). Attributes the record already carries
// under the same key are not repeated. Log with the context-taking methods
// (InfoContext, …) to get them.
//
// After WithGroup, the attributes go into the open group, like any attribute
// added by the record.
type LogHandler struct {
	next slog.Handler
}

var _ slog.Handler = (*LogHandler)(nil)

// NewLogHandler wraps next.
func NewLogHandler(next slog.Handler) *LogHandler { return &LogHandler{next: next} }

// Enabled reports whether next is enabled at level.
func (h *LogHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

// Handle adds the context's attributes to r and passes it to next.
func (h *LogHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx == nil {
		return h.next.Handle(ctx, r)
	}
	var have [5]bool // keys the record already has, in the order of the constants
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case LogCorrelationID:
			have[0] = true
		case LogTraceID:
			have[1] = true
		case LogSpanID:
			have[2] = true
		case LogJobType:
			have[3] = true
		case LogAttempt:
			have[4] = true
		}
		return true
	})
	var attrs [5]slog.Attr
	n := 0
	if id := sdk.CorrelationID(ctx); id != "" && !have[0] {
		attrs[n] = sdk.LogText(LogCorrelationID, id) // the message's, inside a delivery
		n++
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		if !have[1] {
			attrs[n] = slog.String(LogTraceID, sc.TraceID().String())
			n++
		}
		if !have[2] {
			attrs[n] = slog.String(LogSpanID, sc.SpanID().String())
			n++
		}
	}
	if st := stateFrom(ctx); st != nil {
		if !have[3] {
			attrs[n] = sdk.LogText(LogJobType, st.d.Message().Type)
			n++
		}
		if !have[4] {
			attrs[n] = slog.Int(LogAttempt, st.d.Attempt())
			n++
		}
	}
	if n > 0 {
		r = r.Clone()
		r.AddAttrs(attrs[:n]...)
	}
	return h.next.Handle(ctx, r)
}

// WithAttrs returns a LogHandler over next.WithAttrs(attrs).
func (h *LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &LogHandler{next: h.next.WithAttrs(attrs)}
}

// WithGroup returns a LogHandler over next.WithGroup(name).
func (h *LogHandler) WithGroup(name string) slog.Handler {
	return &LogHandler{next: h.next.WithGroup(name)}
}
