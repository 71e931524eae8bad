package telemetry_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// TestPublisherOutsidePoolKeepsEachCallersTrace: the order the docs give
// for a broker without its own PublishAsync, tel.Publisher(
// sdk.NewAsyncPublisher(broker)), puts every message under its own
// caller's trace, however the pool batches them: its PublishAsync stamps
// the message under the caller's context before the pool sees it. (The
// other order publishes a batch under its first caller's context; the
// docs of sdk.AsyncPool and package telemetry say so.)
func TestPublisherOutsidePoolKeepsEachCallersTrace(t *testing.T) {
	tp, _ := newTracing(t)
	obs, _ := newObserver(t, tp, telemetry.Options{})
	mem := newMemory(t)
	pool := sdk.NewAsyncPublisher(mem, sdk.AsyncOptions{MaxBatch: 50, Senders: 1})
	defer pool.Close()
	ap := asyncOf(t, obs.Publisher(pool))
	ctx := waitCtx(t)

	const callers = 40
	traceOf := make(map[string]string, callers) // message ID -> its caller's trace ID
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Go(func() {
			cctx, span := tp.Tracer("test").Start(ctx, "caller")
			defer span.End()
			<-start // all at once: the pool batches them
			m := &sdk.Message{Type: "t", Body: []byte("{}")}
			res, err := ap.PublishAsync(cctx, "poolorder", m)
			if err != nil {
				t.Error(err)
				return
			}
			if err := res.Wait(ctx); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			traceOf[m.ID] = span.SpanContext().TraceID().String()
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	for seen := 0; seen < callers; {
		ds, err := mem.Receive(ctx, "poolorder", callers)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			seen++
			m := d.Message()
			tp := m.Header("traceparent") // 00-<trace id>-<span id>-<flags>
			parts := strings.Split(tp, "-")
			if len(parts) != 4 || parts[1] != traceOf[m.ID] {
				t.Errorf("message %s carries traceparent %q, its caller's trace is %s", m.ID, tp, traceOf[m.ID])
			}
			_ = d.Ack(ctx)
		}
	}
}
