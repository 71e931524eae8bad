package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"testing/slogtest"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/berthtest"

	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// TestLogHandlerIsASlogHandler runs the standard library's handler
// conformance suite over LogHandler.
func TestLogHandlerIsASlogHandler(t *testing.T) {
	var buf bytes.Buffer
	h := telemetry.NewLogHandler(slog.NewJSONHandler(&buf, nil))
	results := func() []map[string]any {
		var out []map[string]any
		for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal(line, &m); err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
		}
		return out
	}
	if err := slogtest.TestHandler(h, results); err != nil {
		t.Error(err)
	}
}

// TestLogHandlerOutsideAWorker: a plain context with a correlation ID and a
// span gives those attributes, and no job type or attempt.
func TestLogHandlerOutsideAWorker(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(&buf, nil)))
	tp, _ := newTracing(t)
	ctx, span := tp.Tracer("test").Start(sdk.WithCorrelationID(context.Background(), "corr-1"), "op")
	defer span.End()
	logger.InfoContext(ctx, "hello")
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	sc := trace.SpanContextFromContext(ctx)
	want := map[string]any{"correlation_id": "corr-1", "trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
	if _, ok := m["job_type"]; ok {
		t.Error("job_type outside a delivery")
	}
	buf.Reset()
	logger.InfoContext(ctx, "again", "correlation_id", "explicit")
	if bytes.Count(buf.Bytes(), []byte(`"correlation_id"`)) != 1 || !bytes.Contains(buf.Bytes(), []byte(`"explicit"`)) {
		t.Errorf("a record's own correlation_id was duplicated or replaced: %s", buf.Bytes())
	}
}

// TestLogHandlerBoundsMessageFields: the correlation ID and job type the
// handler adds inside a delivery come from the message, written by any
// producer; they go through sdk.LogText (valid UTF-8, at most
// sdk.MaxLogTextLength bytes) as ARCHITECTURE.md (Telemetry) promises for
// every log record, not whole into every line the handler logs.
func TestLogHandlerBoundsMessageFields(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(&buf, nil)))
	obs, _ := newObserver(t, noop.NewTracerProvider(), telemetry.Options{})
	long := strings.Repeat("x", 64<<10)
	fd := berthtest.NewDelivery(&sdk.Message{ID: "m", Type: long + "\xff", CorrelationID: long})
	ctx := obs.Start(context.Background(), fd)
	logger.InfoContext(ctx, "handling")
	obs.Settled(ctx, fd, sdk.Settlement{Action: sdk.ActionAck})
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{telemetry.LogCorrelationID, telemetry.LogJobType} {
		v, _ := m[k].(string)
		if v == "" || len(v) > sdk.MaxLogTextLength || !utf8.ValidString(v) {
			t.Errorf("%s: %d bytes (valid UTF-8: %v), want 1..%d valid", k, len(v), utf8.ValidString(v), sdk.MaxLogTextLength)
		}
	}
}
