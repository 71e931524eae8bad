package telemetry_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// TestQueueGaugesPerSystem: one process inspecting a queue of the same name
// on two brokers (a RabbitMQ queue and its PostgreSQL successor during a
// migration, say) reported both under messaging.destination.name alone: the
// two observations of a collection had one attribute set, and the gauge kept
// the last, so the depth of one queue was silently lost. The gauges carry
// messaging.system, as every delivery metric does.
func TestQueueGaugesPerSystem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := uniqueQueue(t, "berth_telgauge")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	pg, err := postgres.New(pool, postgres.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Close() })
	if err := pg.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	mem := newMemory(t)

	const queue = "billing"
	for b, n := range map[sdk.Broker]int{mem: 2, pg: 3} {
		declare(t, b, queue)
		for range n {
			if err := b.Publish(ctx, queue, &sdk.Message{Type: "charge"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{Queues: []telemetry.InspectedQueue{
		{Inspector: mem, Queue: queue}, {Inspector: pg, Queue: queue},
	}})
	ms := collect(t, reader)
	ready := telemetry.AttrQueueState.String("ready")
	if got := ms.sum("berth.queue.depth", ready); got != 5 {
		t.Errorf("ready messages of queue %s over both brokers: %v, want 5", queue, got)
	}
	for sys, want := range map[string]float64{"memory": 2, "postgres": 3} {
		if got := ms.sum("berth.queue.depth", ready, semconv.MessagingSystemKey.String(sys)); got != want {
			t.Errorf("ready messages with messaging.system %s: %v, want %v", sys, got, want)
		}
	}
}

// TestQueueListedTwiceIsReadOnce: one broker's queue listed twice in
// Options.Queues is read once a collection (before, its Stats ran twice);
// New refuses neither that nor two brokers of one system with a queue of
// the same name (a setup that started before the gauges carried
// messaging.system must still start).
func TestQueueListedTwiceIsReadOnce(t *testing.T) {
	a, b := newMemory(t), newMemory(t)
	declare(t, a, "billing")
	counting := &countingInspector{Inspector: a}
	_, reader := newObserver(t, noop.NewTracerProvider(), telemetry.Options{Queues: []telemetry.InspectedQueue{
		{Inspector: counting, Queue: "billing"}, {Inspector: counting, Queue: "billing"},
	}})
	collect(t, reader)
	if n := counting.calls.Load(); n != 1 {
		t.Errorf("Stats called %d times a collection, want 1", n)
	}
	o2, err := telemetry.New(telemetry.Options{Queues: []telemetry.InspectedQueue{
		{Inspector: a, Queue: "billing"}, {Inspector: b, Queue: "billing"},
	}})
	if err != nil {
		t.Fatalf("two brokers of one system with a queue of one name refused: %v", err)
	}
	_ = o2.Close()
}

// countingInspector counts the Stats calls it passes on.
type countingInspector struct {
	sdk.Inspector
	calls atomic.Int32
}

func (c *countingInspector) Stats(ctx context.Context, queue string) (sdk.QueueStats, error) {
	c.calls.Add(1)
	return c.Inspector.Stats(ctx, queue)
}
