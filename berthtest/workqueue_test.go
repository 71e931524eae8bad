package berthtest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// hopPublisher records the queue of each Publish.
type hopPublisher struct {
	mu     sync.Mutex
	queues []string
}

func (p *hopPublisher) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	if err := sdk.PrepareAll(ctx, queue, msgs, 0); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.queues = append(p.queues, queue)
	return nil
}

// TestWorkDeliveryComesFromTheWorkersQueue: a Worker only ever gets
// deliveries of the queue(s) it consumes, so the delivery Work makes for
// WorkerOptions naming the Worker's queue comes from that queue (the first
// of Queues), unless the Queue option says otherwise. Before, it came from
// DefaultQueue ("berthtest"), a queue the Worker does not consume: what
// goes by d.Queue() — a handler's follow-up, sdk.LongDelay's hop, the
// labels of telemetry, the ledger, a Recorder — saw "berthtest" where
// production sees the Worker's queue.
func TestWorkDeliveryComesFromTheWorkersQueue(t *testing.T) {
	pub := &hopPublisher{}
	ld := sdk.LongDelay{Publisher: pub, Limit: time.Minute}
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	due := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	for _, c := range []struct {
		name string
		o    sdk.WorkerOptions
		opts []berthtest.Option
		want string
	}{
		{"Queue", sdk.WorkerOptions{Queue: "orders"}, nil, "orders"},
		{"Queues", sdk.WorkerOptions{Queues: []sdk.WorkerQueue{{Name: "emails"}, {Name: "orders"}}}, nil, "emails"},
		{"Queue option wins", sdk.WorkerOptions{Queues: []sdk.WorkerQueue{{Name: "emails"}, {Name: "orders"}}}, []berthtest.Option{berthtest.Queue("orders")}, "orders"},
		{"no queue", sdk.WorkerOptions{}, nil, berthtest.DefaultQueue},
	} {
		t.Run(c.name, func(t *testing.T) {
			pub.mu.Lock()
			pub.queues = nil
			pub.mu.Unlock()
			rec := berthtest.NewRecorder()
			o := c.o
			o.Middleware = []sdk.Middleware{ld.Middleware()}
			o.Observers = []sdk.Observer{rec}
			m := &sdk.Message{Type: "job", Headers: map[string]string{sdk.HeaderDueAt: due}}
			res := berthtest.Work(t, h, m, append(c.opts, berthtest.WorkerOptions(o))...)
			if !res.Acked() {
				t.Fatalf("got %s (%v), want an ack (the hop published)", res.Action, res.Cause)
			}
			if q := res.Delivery.Queue(); q != c.want {
				t.Errorf("delivery from %q, want %q", q, c.want)
			}
			pub.mu.Lock()
			queues := pub.queues
			pub.mu.Unlock()
			if len(queues) != 1 || queues[0] != c.want {
				t.Errorf("LongDelay hopped to %q, want [%s]", queues, c.want)
			}
			if rs := rec.Records(); len(rs) != 1 || rs[0].Queue != c.want {
				t.Errorf("recorder saw %+v, want one settlement on %q", rs, c.want)
			}
		})
	}
	// NewDelivery takes the same options, and the same default.
	if q := berthtest.NewDelivery(&sdk.Message{Type: "job"}, berthtest.WorkerOptions(sdk.WorkerOptions{Queue: "orders"})).Queue(); q != "orders" {
		t.Errorf("NewDelivery with the Worker's options: queue %q, want orders", q)
	}
}
