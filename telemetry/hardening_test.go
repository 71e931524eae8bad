package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// oneDelivery publishes and receives one message on a fresh memory queue;
// the tests hand the Observer that delivery under other messages.
func oneDelivery(t *testing.T) sdk.Delivery {
	t.Helper()
	b := newMemory(t)
	queue := uniqueQueue(t, "hd")
	if err := b.Publish(context.Background(), queue, &sdk.Message{Type: "t"}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(context.Background(), queue, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %v, %d deliveries", err, len(ds))
	}
	t.Cleanup(func() { _ = ds[0].Ack(context.Background()) })
	return ds[0]
}

// jobTypeValues returns the distinct berth.job.type values of metric name's
// data points.
func jobTypeValues(t *testing.T, ms metrics, name string) map[string]int64 {
	t.Helper()
	m, ok := ms.find(name)
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is a %T", name, m.Data)
	}
	out := map[string]int64{}
	for _, p := range sum.DataPoints {
		v, _ := p.Attributes.Value(telemetry.AttrJobType)
		out[v.AsString()] += p.Value
	}
	return out
}

// TestHardening10_TypeCardinalityBounded: issue 11 item 10. The job type
// comes from the message; 100,000 distinct types made 100,000 label sets per
// instrument (~247 MiB). Declared types and the first MaxJobTypes others get
// their own value, every other type is counted under OtherJobType, and the
// Observer caches a bounded number of label sets.
func TestHardening10_TypeCardinalityBounded(t *testing.T) {
	const types = 100_000
	obs, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{
		JobTypes:    []string{"declared"},
		MaxJobTypes: 50,
	})
	ctx := context.Background()
	for i := range types {
		fd := berthtest.NewDelivery(&sdk.Message{ID: "m", Type: fmt.Sprintf("type-%d", i)})
		obs.Settled(obs.Start(ctx, fd), fd, sdk.Settlement{Action: sdk.ActionAck})
		if i == types/2 { // a declared type counts on its own even after the bound is reached
			fd := berthtest.NewDelivery(&sdk.Message{ID: "m", Type: "declared"})
			obs.Settled(obs.Start(ctx, fd), fd, sdk.Settlement{Action: sdk.ActionAck})
		}
	}
	if n := telemetry.LabelSets(obs); n > 50+2 {
		t.Errorf("the Observer caches %d label sets after %d job types, want at most 52", n, types)
	}
	ms := collect(t, reader)
	for _, name := range []string{"messaging.client.consumed.messages", "berth.delivery.settlements"} {
		got := jobTypeValues(t, ms, name)
		if len(got) > 52 {
			t.Errorf("%s has %d berth.job.type values, want at most 52", name, len(got))
		}
		if got[telemetry.OtherJobType] != types-50 {
			t.Errorf("%s counts %d under %s, want %d", name, got[telemetry.OtherJobType], telemetry.OtherJobType, types-50)
		}
		if got["declared"] != 1 || got["type-0"] != 1 || got["type-49"] != 1 {
			t.Errorf("%s: declared %d, type-0 %d, type-49 %d; want 1 each", name, got["declared"], got["type-0"], got["type-49"])
		}
	}
}

// TestHardening11_CountersExportedAfterClose: issue 11 item 11. Close
// unregistered the delivery counters with the gauges, so the final export
// of a shutting-down process (Observer closed, then the MeterProvider
// flushed) lost every count.
func TestHardening11_CountersExportedAfterClose(t *testing.T) {
	d := oneDelivery(t)
	obs, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{})
	ctx := obs.Start(context.Background(), d)
	obs.Settled(ctx, d, sdk.Settlement{Action: sdk.ActionAck})
	if err := obs.Close(); err != nil {
		t.Fatal(err)
	}
	ms := collect(t, reader)
	if got := ms.sum("messaging.client.consumed.messages"); got != 1 {
		t.Errorf("consumed after Close: %v, want 1", got)
	}
	if got := ms.sum("berth.delivery.settlements", attribute.String("berth.settlement.action", "ack")); got != 1 {
		t.Errorf("settlements after Close: %v, want 1", got)
	}
	if err := obs.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestHardening11_SpanErrorTextSanitised: issue 11 item 11. The dead-letter
// reason, the settlement error and the recorded exception carried the raw
// cause text on the span: any bytes, any length. They are bounded and made
// valid UTF-8 as the dead-letter reason header is (sdk.SanitizeReason).
func TestHardening11_SpanErrorTextSanitised(t *testing.T) {
	d := oneDelivery(t)
	tp, rec := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{})
	cause := errors.New("bad \xff input " + strings.Repeat("x", 10*sdk.MaxReasonLength))
	settleErr := fmt.Errorf("settle \xfe: %w", errors.New(strings.Repeat("y", 10*sdk.MaxReasonLength)))
	ctx := obs.Start(context.Background(), d)
	obs.Settled(ctx, d, sdk.Settlement{Action: sdk.ActionDeadLetter, Cause: cause, Class: sdk.ClassPermanent, Err: settleErr})

	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans ended, want 1", len(spans))
	}
	check := func(what, v string) {
		t.Helper()
		if !utf8.ValidString(v) || len(v) > sdk.MaxReasonLength || v != sdk.SanitizeReason(v) {
			t.Errorf("%s: %d bytes, valid UTF-8 %v; want it sanitised (<= %d bytes)", what, len(v), utf8.ValidString(v), sdk.MaxReasonLength)
		}
	}
	attrs := attrsOf(spans[0])
	for _, k := range []attribute.Key{telemetry.AttrDeadLetterReason, telemetry.AttrSettleError} {
		v, ok := attrs[k]
		if !ok {
			t.Fatalf("no %s attribute", k)
		}
		check(string(k), v.AsString())
	}
	if got, want := attrs[telemetry.AttrDeadLetterReason].AsString(), sdk.SanitizeReason(cause.Error()); got != want {
		t.Errorf("reason %.40q…, want %.40q…", got, want)
	}
	var exceptions int
	for _, e := range spans[0].Events() {
		if e.Name != "exception" {
			continue
		}
		exceptions++
		for _, kv := range e.Attributes {
			switch kv.Key {
			case "exception.message":
				check("exception.message", kv.Value.AsString())
			case "exception.type":
				if kv.Value.AsString() != "*errors.errorString" {
					t.Errorf("exception.type %q, want *errors.errorString", kv.Value.AsString())
				}
			}
		}
	}
	if exceptions != 1 {
		t.Errorf("%d exception events, want 1", exceptions)
	}
}

// TestMessageTextExportedAsValidUTF8: a message's ID, type and correlation
// ID come from its producer, which may be outside berth and send any bytes
// (AMQP's message-id, type and correlation-id are raw short strings). They
// reached span attributes and the berth.job.type label as they came; an
// OTLP exporter refuses a whole batch with one string that is not valid
// UTF-8 (protobuf strings must be), and a label set stays for the
// Observer's life, so one such message failed every metric export after it.
func TestMessageTextExportedAsValidUTF8(t *testing.T) {
	tp, rec := newTracing(t)
	obs, reader := newObserver(t, tp, telemetry.Options{})
	ctx := context.Background()
	m := &sdk.Message{ID: "id-\xff", Type: "billing.\xfe", CorrelationID: "corr-\xc3("}
	fd := berthtest.NewDelivery(m)
	hctx := obs.Start(ctx, fd)
	obs.LeaseExtended(hctx, fd, time.Second, nil)
	obs.Idempotency().Observe(hctx, idempotency.EventDuplicate, m.Type)
	obs.Settled(hctx, fd, sdk.Settlement{Action: sdk.ActionRetry, Delay: time.Second, Class: sdk.ClassTransient, Cause: errors.New("x"), Duration: time.Millisecond})
	obs.DuplicateSuppressed(ctx, m.Type) // outside a delivery
	if err := obs.Publisher(refuseAll{}).Publish(ctx, "billing", m.Clone()); err == nil {
		t.Fatal("the publisher accepted the message")
	}

	invalid := func(what string, kvs []attribute.KeyValue) {
		t.Helper()
		for _, kv := range kvs {
			if kv.Value.Type() == attribute.STRING && !utf8.ValidString(kv.Value.AsString()) {
				t.Errorf("%s: %s = %q is not valid UTF-8", what, kv.Key, kv.Value.AsString())
			}
		}
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want a process and a send span", len(spans))
	}
	for _, s := range spans {
		invalid("span "+s.Name(), s.Attributes())
	}
	ms := collect(t, reader)
	var points int
	for _, sm := range ms.rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					points++
					invalid(mt.Name, p.Attributes.ToSlice())
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					points++
					invalid(mt.Name, p.Attributes.ToSlice())
				}
			}
		}
	}
	if points == 0 {
		t.Fatal("no data point collected")
	}
}

// refuseAll refuses every publish, as a broker refuses a message that is not
// valid UTF-8.
type refuseAll struct{}

func (refuseAll) Publish(context.Context, string, ...*sdk.Message) error {
	return sdk.ErrInvalidMessage
}

// TestJobAttrsOwnTypeLimit: a guard event recorded by one Observer inside a
// delivery started by another took the job-type label the other Observer
// chose, so the other's MaxJobTypes applied instead of its own.
func TestJobAttrsOwnTypeLimit(t *testing.T) {
	wide, _ := newObserver(t, noop.NewTracerProvider(), telemetry.Options{MaxJobTypes: 100})
	narrow, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{
		JobTypes:    []string{"declared"},
		MaxJobTypes: -1, // no job type of its own beyond the declared one
	})
	ctx := context.Background()
	for _, typ := range []string{"a", "b", "declared"} {
		fd := berthtest.NewDelivery(&sdk.Message{ID: "m", Type: typ})
		hctx := wide.Start(ctx, fd)
		narrow.Idempotency().Observe(hctx, idempotency.EventDuplicate, "")
		wide.Settled(hctx, fd, sdk.Settlement{Action: sdk.ActionAck})
	}
	got := jobTypeValues(t, collect(t, reader), "berth.idempotency.events")
	want := map[string]int64{telemetry.OtherJobType: 2, "declared": 1}
	if len(got) != len(want) || got[telemetry.OtherJobType] != 2 || got["declared"] != 1 {
		t.Errorf("berth.idempotency.events per berth.job.type = %v, want %v", got, want)
	}
}

// TestRecordersOwnTypeLimit: as TestJobAttrsOwnTypeLimit, for the recorders
// other packages call inside a handler (VersionConflict, LockWait,
// DuplicateSuppressed). In a delivery started by another Observer they took
// the job-type label that Observer chose: a version conflict or a lock wait
// carried every type the starting Observer admitted, beyond the recording
// Observer's own limit, and a duplicate of a type the recording Observer
// declares was counted under OtherJobType when the starting Observer had
// not admitted it.
func TestRecordersOwnTypeLimit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		starting int // the starting Observer's MaxJobTypes
	}{
		{"starter admits every type", 100},
		{"starter admits none", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			starter, _ := newObserver(t, noop.NewTracerProvider(), telemetry.Options{MaxJobTypes: tc.starting})
			rec, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{
				JobTypes:    []string{"declared"},
				MaxJobTypes: -1, // no job type of its own beyond the declared one
			})
			ctx := context.Background()
			for _, typ := range []string{"a", "b", "declared"} {
				fd := berthtest.NewDelivery(&sdk.Message{ID: "m", Type: typ})
				hctx := starter.Start(ctx, fd)
				rec.VersionConflict(hctx, "orders")
				rec.LockWait(hctx, "orders", time.Millisecond, true)
				rec.DuplicateSuppressed(hctx, "")
				starter.Settled(hctx, fd, sdk.Settlement{Action: sdk.ActionAck})
			}
			ms := collect(t, reader)
			want := map[string]int64{telemetry.OtherJobType: 2, "declared": 1}
			for _, name := range []string{"berth.concurrency.version_conflicts", "berth.idempotency.duplicates"} {
				if got := jobTypeValues(t, ms, name); !maps.Equal(got, want) {
					t.Errorf("%s per berth.job.type = %v, want %v", name, got, want)
				}
			}
			m, ok := ms.find("berth.concurrency.lock_wait.duration")
			if !ok {
				t.Fatal("no lock wait recorded")
			}
			got := map[string]int64{}
			for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				v, _ := p.Attributes.Value(telemetry.AttrJobType)
				got[v.AsString()] += int64(p.Count)
			}
			if !maps.Equal(got, want) {
				t.Errorf("berth.concurrency.lock_wait.duration per berth.job.type = %v, want %v", got, want)
			}
		})
	}
}
