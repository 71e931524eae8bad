package ledger_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// A job's generation comes from its berth-redrive-count header, which any
// producer can set (berth's Publish refuses it; a foreign producer on the
// broker itself, here a plain AMQP publish to RabbitMQ, does not). The ledger read it with strconv.Atoi, and a redrive
// (sdk.PrepareRedrive) wrote Atoi+1 back, so a forged value made the
// redriven job's events older than its row: "-1" read as generation 0 and
// came back from the redrive as "0", generation 0 again, below the row the
// redrive had moved to generation 1; a huge one was clamped to the store's
// bound and came back from the redrive clamped to the same (or, from
// MaxInt64, overflowed to a negative count). The redriven job's start and
// its success were dropped, and its row stayed "redriven" until the janitor
// deleted it. A count that is not 1 to 9 ASCII digits (the PostgreSQL
// broker's rule) is now no count, in the ledger and in PrepareRedrive
// alike: such a job is generation 0, and generation 1 once redriven.
func TestForgedRedriveCountDoesNotDropRedrivenJob(t *testing.T) {
	e := rabbitEnv(t)
	ctx := testCtx(t, 60*time.Second)
	cases := []struct {
		header  string
		gen, re int // the generation before and after the redrive
		message *sdk.Message
	}{
		{header: "-1", gen: 0, re: 1},
		{header: "-5", gen: 0, re: 1},
		{header: "+3", gen: 0, re: 1},
		{header: "99999999999", gen: 0, re: 1},
		{header: "9223372036854775807", gen: 0, re: 1},
		{header: "not a number", gen: 0, re: 1},
		{header: "7", gen: 7, re: 8}, // a count as a redrive writes it: kept
	}
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
	)
	h := sdk.HandlerFunc(func(_ context.Context, d sdk.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if seen[d.Message().ID] {
			return nil
		}
		seen[d.Message().ID] = true
		return sdk.Permanent(errors.New("first run fails"))
	})
	conn, err := amqp.Dial(integration.RabbitMQURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := range cases {
		m := &sdk.Message{ID: sdk.NewID(), Type: "ledger.forged"}
		confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", e.queue, true, false, amqp.Publishing{
			MessageId: m.ID, Type: m.Type, DeliveryMode: amqp.Persistent, Body: []byte(`{}`),
			Headers: amqp.Table{sdk.HeaderRedriveCount: cases[i].header},
		})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := confirm.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("confirm: %v %v", ok, err)
		}
		cases[i].message = m
	}
	w := startWorker(t, e, h, sdk.WorkerOptions{})
	for _, c := range cases {
		j := waitJob(t, ctx, e.reader, c.message.ID, "dead", func(j *ledger.Job) bool { return j.Status == ledger.StatusDead })
		if j.Generation != c.gen {
			t.Errorf("redrive count %q: dead in generation %d, want %d", c.header, j.Generation, c.gen)
		}
	}
	time.Sleep(10 * time.Millisecond) // the redrive begins strictly after the deaths
	ids := make([]string, len(cases))
	for i, c := range cases {
		ids[i] = c.message.ID
	}
	if n, err := e.deadLetters().RedriveDeadLetters(ctx, e.queue, ids...); err != nil || n != len(ids) {
		t.Fatalf("RedriveDeadLetters = %d, %v; want %d", n, err, len(ids))
	}
	// Within a few seconds each: a row the redriven job never leaves
	// would otherwise wait out the whole test's time.
	deadline := time.Now().Add(5 * time.Second)
	for _, c := range cases {
		var j *ledger.Job
		for {
			var err error
			if j, err = e.reader.Job(ctx, c.message.ID); err != nil {
				t.Fatal(err)
			}
			if j.Status == ledger.StatusSucceeded || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if j.Status != ledger.StatusSucceeded || j.Generation != c.re || j.Attempts != 1 {
			t.Errorf("redrive count %q, after its redrive: %s in generation %d at attempt %d; want succeeded in generation %d at attempt 1",
				c.header, j.Status, j.Generation, j.Attempts, c.re)
		}
	}
	w.stop(t)
}
