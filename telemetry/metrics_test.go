package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// metrics is one collection of a ManualReader.
type metrics struct {
	t  testing.TB
	rm metricdata.ResourceMetrics
}

func collect(t testing.TB, r *sdkmetric.ManualReader) metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return metrics{t: t, rm: rm}
}

func (ms metrics) find(name string) (metricdata.Metrics, bool) {
	for _, sm := range ms.rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// matches reports whether set has every key=value of want.
func matches(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum adds the values (for histograms, the counts) of name's data points
// whose attributes include want.
func (ms metrics) sum(name string, want ...attribute.KeyValue) float64 {
	m, ok := ms.find(name)
	if !ok {
		return 0
	}
	var total float64
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				total += float64(p.Value)
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				total += float64(p.Value)
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				total += p.Value
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				total += float64(p.Count)
			}
		}
	default:
		ms.t.Fatalf("metric %s has unexpected data %T", name, m.Data)
	}
	return total
}

// histSum is the sum of the recorded values of histogram name.
func (ms metrics) histSum(name string, want ...attribute.KeyValue) float64 {
	m, _ := ms.find(name)
	d, _ := m.Data.(metricdata.Histogram[float64])
	var total float64
	for _, p := range d.DataPoints {
		if matches(p.Attributes, want) {
			total += p.Sum
		}
	}
	return total
}

func (ms metrics) unit(name string) string {
	m, ok := ms.find(name)
	if !ok {
		ms.t.Fatalf("metric %s not collected", name)
	}
	return m.Unit
}

// TestMetricsCountAScriptedScenario publishes dups duplicates (same
// idempotency key and payload as an earlier job), conflicts (same key,
// different payload), retried jobs that fail once transiently, and dead jobs
// that fail permanently, through the idempotency guard (memstore) reporting to
// the Observer, and checks that every counter says exactly that.
func TestMetricsCountAScriptedScenario(t *testing.T) {
	const (
		unique    = 5 // jobs that succeed first time
		dups      = 3 // duplicates of the first three of them
		conflicts = 1 // the key of order_0 with another payload
		retry     = 4 // jobs that fail once, then succeed
		dead      = 2 // jobs that fail permanently
	)
	b := newMemory(t)
	queue := uniqueQueue(t, "tm")
	obs, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{
		Queues: []telemetry.InspectedQueue{{Inspector: b, Queue: queue}},
	})
	pub := obs.Publisher(b)
	ctx := context.Background()

	charge := func(i int, amount string) *sdk.Message {
		return &sdk.Message{Type: "billing.charge", IdempotencyKey: fmt.Sprintf("charge:order_%d:v1", i), Body: []byte(amount)}
	}
	var msgs []*sdk.Message
	for i := range unique {
		msgs = append(msgs, charge(i, "10.00"))
	}
	for i := range dups {
		msgs = append(msgs, charge(i, "10.00"))
	}
	for range conflicts {
		msgs = append(msgs, charge(0, "99.00"))
	}
	for i := range retry {
		msgs = append(msgs, &sdk.Message{Type: "email.send", IdempotencyKey: fmt.Sprintf("email:welcome:user_%d", i)})
	}
	for i := range dead {
		msgs = append(msgs, &sdk.Message{Type: "invoice.sync", IdempotencyKey: fmt.Sprintf("sync_invoice:inv_%d", i)})
	}
	// One publish per message, in this order: the duplicates come after
	// their originals, and the Worker below takes one at a time.
	for _, m := range msgs {
		if err := pub.Publish(ctx, queue, m); err != nil {
			t.Fatal(err)
		}
	}

	guard, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{}), Observer: obs.Idempotency(), Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		switch d.Message().Type {
		case "email.send":
			if d.Attempt() == 1 {
				return errors.New("smtp busy")
			}
		case "invoice.sync":
			return sdk.Permanent(errors.New("invoice missing"))
		}
		return nil
	})
	stop := runWorker(t, b, h, sdk.WorkerOptions{
		Queue:       queue,
		Concurrency: 1,
		Retry:       sdk.RetryPolicy{MaxAttempts: 3, Backoff: sdk.Backoff{Base: 20 * time.Millisecond, Max: 20 * time.Millisecond, Jitter: -1}},
		Middleware:  []sdk.Middleware{guard.Middleware()},
		Observers:   []sdk.Observer{obs},
	})
	total := unique + dups + conflicts + retry + dead
	deliveries := total + retry
	eventually(t, 20*time.Second, "every delivery settled", func() bool {
		return collect(t, reader).sum("berth.delivery.settlements") == float64(deliveries)
	})
	stop()

	ms := collect(t, reader)
	job := func(jobType string) attribute.KeyValue { return telemetry.AttrJobType.String(jobType) }
	errType := func(c sdk.ErrorClass) attribute.KeyValue { return attribute.String("error.type", string(c)) }
	checks := []struct {
		what  string
		got   float64
		want  int
		unit  string
		instr string
	}{
		{"sent", ms.sum("messaging.client.sent.messages"), total, "{message}", "messaging.client.sent.messages"},
		{"consumed", ms.sum("messaging.client.consumed.messages"), deliveries, "{message}", "messaging.client.consumed.messages"},
		{"duplicates", ms.sum("berth.idempotency.duplicates", job("billing.charge")), dups, "{message}", "berth.idempotency.duplicates"},
		{"conflicts", ms.sum("berth.idempotency.conflicts", job("billing.charge")), conflicts, "{conflict}", "berth.idempotency.conflicts"},
		{"guard events: duplicates", ms.sum("berth.idempotency.events", telemetry.AttrIdempotencyEvent.String("duplicate_suppressed")), dups, "{event}", "berth.idempotency.events"},
		{"retries", ms.sum("berth.job.retries", job("email.send"), errType(sdk.ClassTransient)), retry, "{retry}", "berth.job.retries"},
		{"retries of other types", ms.sum("berth.job.retries") - float64(retry), 0, "", ""},
		{"redeliveries", ms.sum("berth.delivery.redeliveries", job("email.send")), retry, "{delivery}", "berth.delivery.redeliveries"},
		{"dead letters", ms.sum("berth.job.dead_letters", job("invoice.sync"), errType(sdk.ClassPermanent)), dead, "{message}", "berth.job.dead_letters"},
		{"dead letters of conflicts", ms.sum("berth.job.dead_letters", job("billing.charge"), errType(sdk.ClassPermanent)), conflicts, "", ""},
		{"dead letters in all", ms.sum("berth.job.dead_letters"), dead + conflicts, "", ""},
		{"acks", ms.sum("berth.delivery.settlements", attribute.String("berth.settlement.action", "ack")), unique + dups + retry, "{delivery}", "berth.delivery.settlements"},
		{"transient errors", ms.sum("berth.job.errors", errType(sdk.ClassTransient)), retry, "{error}", "berth.job.errors"},
		{"permanent errors", ms.sum("berth.job.errors", errType(sdk.ClassPermanent)), dead + conflicts, "", ""},
		{"in flight at the end", ms.sum("berth.worker.in_flight"), 0, "{delivery}", "berth.worker.in_flight"},
		{"process durations", ms.sum("messaging.process.duration"), deliveries, "s", "messaging.process.duration"},
		{"charge durations", ms.sum("messaging.process.duration", job("billing.charge")), unique + dups + conflicts, "", ""},
		{"claim-to-ack latencies", ms.sum("berth.delivery.claim_to_ack.duration"), unique + dups + retry, "s", "berth.delivery.claim_to_ack.duration"},
		{"backoff delays", ms.sum("berth.retry.delay"), retry, "s", "berth.retry.delay"},
		{"dead-lettered in the queue", ms.sum("berth.queue.depth", telemetry.AttrQueueState.String("dead_lettered")), dead + conflicts, "{message}", "berth.queue.depth"},
		{"ready in the queue", ms.sum("berth.queue.depth", telemetry.AttrQueueState.String("ready")), 0, "", ""},
		{"lease expirations", ms.sum("berth.lease.expirations"), 0, "", ""},
	}
	for _, c := range checks {
		if c.got != float64(c.want) {
			t.Errorf("%s: got %v, want %d", c.what, c.got, c.want)
		}
		if c.instr != "" {
			if u := ms.unit(c.instr); u != c.unit {
				t.Errorf("%s: unit %q, want %q", c.instr, u, c.unit)
			}
		}
	}
	if got, want := ms.histSum("berth.retry.delay"), float64(retry)*0.02; got < want-1e-9 || got > want+1e-9 {
		t.Errorf("backoff delay sum %v s, want %v", got, want)
	}
	if _, ok := ms.find("berth.queue.oldest_age"); !ok {
		t.Error("berth.queue.oldest_age not collected")
	}
}

// TestRecordersOutsideADelivery checks the methods other packages call work
// with a bare context (job type given) and with a nil Observer.
func TestRecordersOutsideADelivery(t *testing.T) {
	obs, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{})
	ctx := context.Background()
	obs.DuplicateSuppressed(ctx, "billing.charge")
	obs.IdempotencyConflict(ctx, "billing.charge")
	obs.IdempotencyConflict(ctx, "billing.charge")
	obs.VersionConflict(ctx, "orders")
	obs.LockWait(ctx, "orders", 30*time.Millisecond, true)
	obs.LockWait(ctx, "orders", 50*time.Millisecond, false)
	// The hooks the concurrency packages take (rowlock.Options.Observe,
	// optimistic.Retrier.OnConflict).
	obs.RowLockObserved(ctx, "orders", 20*time.Millisecond, nil)
	obs.RowLockObserved(ctx, "orders", 2*time.Second, errors.New("rowlock: busy"))
	obs.VersionConflictHook("orders")(ctx, 1, errors.New("optimistic: conflict"))

	var none *telemetry.Observer // what FromContext returns outside a Worker
	none.DuplicateSuppressed(ctx, "x")
	none.IdempotencyConflict(ctx, "x")
	none.VersionConflict(ctx, "x")
	none.LockWait(ctx, "x", time.Second, true)
	if telemetry.FromContext(ctx) != nil {
		t.Error("FromContext of a bare context is not nil")
	}

	ms := collect(t, reader)
	charge := telemetry.AttrJobType.String("billing.charge")
	orders := telemetry.AttrResource.String("orders")
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"duplicates", ms.sum("berth.idempotency.duplicates", charge), 1},
		{"idempotency conflicts", ms.sum("berth.idempotency.conflicts", charge), 2},
		{"version conflicts", ms.sum("berth.concurrency.version_conflicts", orders), 2},
		{"lock waits acquired", ms.sum("berth.concurrency.lock_wait.duration", orders, telemetry.AttrLockAcquired.Bool(true)), 2},
		{"lock waits busy", ms.sum("berth.concurrency.lock_wait.duration", orders, telemetry.AttrLockAcquired.Bool(false)), 2},
		{"lock wait seconds", ms.histSum("berth.concurrency.lock_wait.duration", orders), 2.1},
	} {
		if d := c.got - c.want; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if u := ms.unit("berth.concurrency.lock_wait.duration"); u != "s" {
		t.Errorf("lock wait unit %q, want s", u)
	}
}

func TestNewRejectsBadQueues(t *testing.T) {
	if _, err := telemetry.New(telemetry.Options{Queues: []telemetry.InspectedQueue{{Queue: "q"}}}); err == nil {
		t.Error("nil Inspector accepted")
	}
	b := newMemory(t)
	_, err := telemetry.New(telemetry.Options{Queues: []telemetry.InspectedQueue{{Inspector: b, Queue: "bad queue!"}}})
	if !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("bad queue name: err %v, want ErrInvalidQueue", err)
	}
}

func telemetryErrorType(v string) attribute.KeyValue { return attribute.String("error.type", v) }

// TestLeaseExtensionsAndExpirations: a handler that outlives its lease with
// heartbeats on gets its lease extended; with heartbeats off its lease
// expires, the ack fails with ErrLeaseLost and an expiration is counted.
func TestLeaseExtensionsAndExpirations(t *testing.T) {
	tp, rec := newTracing(t)
	obs, reader := newObserver(t, tp, telemetry.Options{})
	ctx := context.Background()

	// Each case has a broker of its own lease. The first delivery's handler
	// holds it for hold (0: until the Worker cancels it); a later delivery
	// is acked at once. run returns once the first handler has returned and
	// a delivery was acked. Leases of a second leave a loaded machine most
	// of a second of slack wherever a stall would change the outcome.
	run := func(queue string, brokerLease, heartbeat, lease, hold time.Duration) {
		b, err := memory.New(memory.Options{Lease: brokerLease, MaxDeliveries: 10})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		if err := obs.Publisher(b).Publish(ctx, queue, &sdk.Message{Type: "report.build"}); err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int64
		acked, first := make(chan struct{}), make(chan struct{})
		stop := runWorker(t, b, sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
			if calls.Add(1) != 1 {
				return nil
			}
			defer close(first)
			timeout := hold
			if timeout == 0 {
				timeout = berthtest.WaitTimeout
			}
			select {
			case <-time.After(timeout):
				if hold == 0 {
					return errors.New("the Worker never cancelled the handler")
				}
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			return nil
		}), sdk.WorkerOptions{Queue: queue, Concurrency: 2, Lease: lease, HeartbeatInterval: heartbeat,
			Observers: []sdk.Observer{obs, sdk.Observer(ackSignal(acked))}})
		<-acked
		<-first
		stop()
	}
	extended, expired, lost := uniqueQueue(t, "tx"), uniqueQueue(t, "te"), uniqueQueue(t, "tl")
	// Two leases long, extended every 100 ms.
	run(extended, time.Second, 100*time.Millisecond, time.Second, 2*time.Second)
	// No heartbeat: the lease ends at 1 s, the other slot acks the message,
	// and the first handler's ack at 1.5 s is refused.
	run(expired, time.Second, -1, time.Second, 1500*time.Millisecond)
	// A Worker that believes the lease is 4.5 s (the broker's is 1 s)
	// heartbeats every 1.5 s: the first extension comes after the message
	// went to the other slot, is refused, and the Worker cancels the handler
	// without settling.
	run(lost, time.Second, 1500*time.Millisecond, 4500*time.Millisecond, 0)

	ms := collect(t, reader)
	if got := ms.sum("berth.lease.extensions", semconvDest(extended), telemetry.AttrLeaseResult.String("ok")); got < 1 {
		t.Errorf("lease extensions with heartbeats: %v, want at least 1", got)
	}
	if got := ms.sum("berth.lease.expirations", semconvDest(extended)); got != 0 {
		t.Errorf("lease expirations with heartbeats: %v, want 0", got)
	}
	if got := ms.sum("berth.lease.expirations", semconvDest(expired)); got != 1 {
		t.Errorf("lease expirations without heartbeats: %v, want 1", got)
	}
	if got := ms.sum("berth.lease.extensions", semconvDest(expired)); got != 0 {
		t.Errorf("lease extensions without heartbeats: %v, want 0", got)
	}
	if got := ms.sum("berth.lease.extensions", semconvDest(lost), telemetry.AttrLeaseResult.String("failed")); got < 1 {
		t.Errorf("refused lease extensions: %v, want at least 1", got)
	}
	if got := ms.sum("berth.lease.expirations", semconvDest(lost)); got != 1 {
		t.Errorf("lease expirations after a refused extension: %v, want 1", got)
	}
	if got := ms.sum("berth.delivery.settlements", semconvDest(lost), attribute.String("berth.settlement.action", "lease_lost")); got != 1 {
		t.Errorf("lease_lost settlements: %v, want 1", got)
	}
	var lostSpans int
	for _, s := range spansNamed(rec, "process "+lost) {
		if attrsOf(s)["berth.settlement.action"].AsString() == string(sdk.ActionLeaseLost) {
			lostSpans++
			if s.Status().Code != codes.Error {
				t.Errorf("lease_lost span status %v, want error", s.Status())
			}
		}
	}
	if lostSpans != 1 {
		t.Errorf("%d process spans with action lease_lost, want 1", lostSpans)
	}
}

func semconvDest(q string) attribute.KeyValue {
	return attribute.String("messaging.destination.name", q)
}

// ackSignal is an Observer that closes its channel at the first successful ack.
type ackSignal chan struct{}

func (a ackSignal) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (a ackSignal) Settled(_ context.Context, _ sdk.Delivery, s sdk.Settlement) {
	if s.Action == sdk.ActionAck && s.Err == nil {
		select {
		case <-a:
		default:
			close(a)
		}
	}
}
