package periodic_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/periodic"
	"github.com/berthq/berth/sdk"
)

// On the PostgreSQL broker with DedupeEnqueue, three schedulers of one job
// store each slot once: "once in effect" is already "once" at publish.
func TestThreeSchedulersPostgresDedupeEnqueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, schema := pgtest.Schema(t, 0)
	b, err := postgres.New(pool, postgres.Options{Schema: schema, DedupeEnqueue: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	start := time.Date(2026, 12, 1, 0, 0, 7, 0, time.UTC)
	f := &fleet{clock: periodic.NewFakeClock(start), publishes: map[time.Time]int{}}
	sched := periodic.MustCron("*/15 * * * * *")
	job := periodic.Job{Name: "pg.sweep", Schedule: sched, Queue: "sweep"}
	var scheds []*periodic.Scheduler
	for range 3 {
		s, err := periodic.New(b, periodic.Options{Clock: f.clock, Missed: periodic.CatchUp, OnPublish: f.onPublish}, job)
		if err != nil {
			t.Fatal(err)
		}
		scheds = append(scheds, s)
	}
	const total = 5 * time.Minute
	f.runSchedulers(t, scheds, total, 20*time.Second, 11)
	want := slotsBetween(sched, start, start.Add(total))

	rows, err := pool.Query(ctx, `SELECT idempotency_key, count(*) FROM `+schema+`.jobs WHERE queue = 'sweep' GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		stored[k] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, slot := range want {
		if f.publishes[slot] != 3 {
			t.Errorf("slot %s: %d publishes, want 3", slot, f.publishes[slot])
		}
		if n := stored[periodic.SlotKey(job.Name, slot)]; n != 1 {
			t.Errorf("slot %s: %d jobs stored, want 1", slot, n)
		}
	}
	if len(stored) != len(want) {
		t.Errorf("%d keys stored, want %d", len(stored), len(want))
	}
}

// On JetStream the slot's ID is the Nats-Msg-Id: the stream keeps one
// message per slot of the three schedulers' publishes (they are within its
// Duplicates window), so the queue holds exactly one message per slot.
func TestThreeSchedulersJetStreamDedupe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := jetstream.Connect(ctx, integration.NATSURL(t), jetstream.ConnectOptions{Name: "berth-periodic-test"},
		jetstream.Options{Prefix: "periodic" + pgtest.Suffix()[:8]})
	if err != nil {
		t.Fatal(err)
	}
	queue := "ticks"
	if err := b.DeclareQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.DeleteQueue(context.Background(), queue); err != nil {
			t.Errorf("delete queue: %v", err)
		}
		_ = b.Close()
	}()

	start := time.Date(2026, 12, 1, 0, 0, 7, 0, time.UTC)
	f := &fleet{clock: periodic.NewFakeClock(start), publishes: map[time.Time]int{}}
	sched := periodic.MustCron("*/15 * * * * *")
	job := periodic.Job{Name: "js.tick", Schedule: sched, Queue: queue}
	var scheds []*periodic.Scheduler
	for range 3 {
		s, err := periodic.New(b, periodic.Options{Clock: f.clock, Missed: periodic.CatchUp, OnPublish: f.onPublish}, job)
		if err != nil {
			t.Fatal(err)
		}
		scheds = append(scheds, s)
	}
	const total = 5 * time.Minute // simulated; the real publishes take well under the 2 min window
	f.runSchedulers(t, scheds, total, 20*time.Second, 5)
	want := slotsBetween(sched, start, start.Add(total))
	for _, slot := range want {
		if f.publishes[slot] != 3 {
			t.Errorf("slot %s: %d publishes, want 3", slot, f.publishes[slot])
		}
	}
	st, err := b.Stats(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != int64(len(want)) {
		t.Fatalf("%d messages stored for %d slots published 3 times each, want one per slot", st.Ready, len(want))
	}
	ds, err := b.Receive(ctx, queue, len(want))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, d := range ds {
		seen[d.Message().IdempotencyKey] = true
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != len(ds) {
		t.Errorf("%d deliveries for %d distinct slot keys", len(ds), len(seen))
	}
}

// A Name of more than 255 bytes (RabbitMQ carries the Type in an AMQP short
// string) or with a NUL (PostgreSQL's text refuses it) made a job whose
// every slot the broker refused at run time: New accepted it, and the
// scheduler logged an error a slot, for ever, running nothing. The brokers
// refuse such messages (checked here, so that the limits stay true), and
// New refuses the job.
func TestNewRefusesNameABrokerRefuses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, schema := pgtest.Schema(t, 0)
	pg, err := postgres.New(pool, postgres.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pg.Close() }()
	if err := pg.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rb, err := rabbitmq.New(ctx, integration.RabbitMQURL(t), rabbitmq.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rb.Close() }()
	queue := "periodic-names-" + pgtest.Suffix()[:8]
	defer func() { _ = rb.DeleteQueue(context.WithoutCancel(ctx), queue) }()
	long := strings.Repeat("n", periodic.MaxNameLength+1)
	for _, c := range []struct {
		name   string
		broker sdk.Publisher
	}{{long, rb}, {"report\x00daily", pg}} {
		if err := c.broker.Publish(ctx, queue, &sdk.Message{Type: c.name}); err == nil {
			t.Fatalf("%T took a message of Type %.40q: the limit New applies is not the broker's", c.broker, c.name)
		}
		_, err := periodic.New(c.broker, periodic.Options{}, periodic.Job{Name: c.name, Schedule: periodic.MustCron("* * * * *"), Queue: queue})
		if !errors.Is(err, periodic.ErrInvalidJob) {
			t.Errorf("New(job %.40q) = %v, want ErrInvalidJob", c.name, err)
		}
	}
	// The longest Name a RabbitMQ broker takes is accepted.
	ok := strings.Repeat("n", periodic.MaxNameLength)
	if err := rb.Publish(ctx, queue, &sdk.Message{Type: ok}); err != nil {
		t.Fatalf("a Type of %d bytes: %v", len(ok), err)
	}
	if _, err := periodic.New(rb, periodic.Options{}, periodic.Job{Name: ok, Schedule: periodic.MustCron("* * * * *"), Queue: queue}); err != nil {
		t.Errorf("New(job of %d bytes) = %v", len(ok), err)
	}
}
