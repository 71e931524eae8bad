package telemetry_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// TestMessageTextBoundedInSpansAndLabels: a message's ID, type and
// correlation ID come from its producer, and nothing bounds their length
// (sdk.Prepare checks UTF-8 only). They reached every span attribute whole,
// and a long type became a berth.job.type label value of its own (one of
// the first MaxJobTypes), kept in every instrument's label sets for the
// Observer's life: one 64 KiB type made every metric export carry it on
// each data point, and a handful of them pass an OTLP receiver's 4 MiB
// message limit, failing every export after them. The text is cut as log
// records cut it (sdk.LogText, sdk.MaxLogTextLength bytes), and a type too
// long for a log record is counted under OtherJobType.
func TestMessageTextBoundedInSpansAndLabels(t *testing.T) {
	b := newMemory(t)
	queue := uniqueQueue(t, "tb")
	declare(t, b, queue)
	tp, rec := newTracing(t)
	obs, reader := newObserver(t, tp, telemetry.Options{JobTypes: []string{"declared"}})

	long := func(c string) string { return strings.Repeat(c, 64<<10) }
	m := &sdk.Message{ID: long("i"), Type: long("t"), CorrelationID: long("c"), Body: []byte("{}")}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := obs.Publisher(b).Publish(ctx, queue, m); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 1)
	handled := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
		return sdk.Permanent(errStr("refused"))
	})
	stop := runWorker(t, b, handled, sdk.WorkerOptions{Queue: queue, Concurrency: 1,
		Observers: []sdk.Observer{obs, settledSignal(done)}})
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the job was not settled")
	}
	stop()

	check := func(what string, kvs []attribute.KeyValue) {
		t.Helper()
		for _, kv := range kvs {
			if kv.Value.Type() == attribute.STRING && len(kv.Value.AsString()) > sdk.MaxLogTextLength {
				t.Errorf("%s: %s is %d bytes, want at most %d", what, kv.Key, len(kv.Value.AsString()), sdk.MaxLogTextLength)
			}
		}
	}
	// The Worker tells the observers in order: the process span ended
	// before done was signalled.
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans ended, want the send and the process span", len(spans))
	}
	for _, s := range spans {
		check("span "+s.Name(), s.Attributes())
		if v, ok := attrsOf(s)["messaging.message.id"]; !ok || v.AsString() != sdk.LogText("", m.ID).Value.String() {
			t.Errorf("span %s: messaging.message.id %.20q… (%d bytes), want the message ID as a log record shows it", s.Name(), v.AsString(), len(v.AsString()))
		}
	}

	ms := collect(t, reader)
	points := 0
	for _, sm := range ms.rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			var sets []attribute.Set
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			}
			for _, s := range sets {
				points++
				check(mt.Name, s.ToSlice())
			}
		}
	}
	if points == 0 {
		t.Fatal("no data point collected")
	}
	if got := jobTypeValues(t, ms, "berth.job.dead_letters"); len(got) != 1 || got[telemetry.OtherJobType] != 1 {
		t.Errorf("berth.job.dead_letters per berth.job.type: %d values, %d under %s; want one dead letter under %s",
			len(got), got[telemetry.OtherJobType], telemetry.OtherJobType, telemetry.OtherJobType)
	}
}

// errStr is an error of fixed text.
type errStr string

func (e errStr) Error() string { return string(e) }

// settledSignal is an Observer that signals each settlement on its channel,
// without blocking.
type settledSignal chan struct{}

func (s settledSignal) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (s settledSignal) Settled(context.Context, sdk.Delivery, sdk.Settlement) {
	select {
	case s <- struct{}{}:
	default:
	}
}
