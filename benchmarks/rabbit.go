package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/sdk"
)

const (
	bodySize = 256
	window   = 256 // raw sliding window of confirms; berth's MaxInFlight
)

func rabbitURL() string {
	if u := os.Getenv("BERTH_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// rabbitEnv is a berth broker, a raw connection and the queues to delete.
type rabbitEnv struct {
	qt     rabbitmq.QueueType
	br     *rabbitmq.Broker
	conn   *amqp.Connection
	berthQ []string // deleted through berth
	rawQ   []string // deleted raw
}

func newRabbitEnv(ctx context.Context, qt rabbitmq.QueueType) (*rabbitEnv, error) {
	br, err := rabbitmq.New(ctx, rabbitURL(), rabbitmq.Options{QueueType: qt, Prefetch: 100, MaxInFlight: window, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	conn, err := amqp.Dial(rabbitURL())
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &rabbitEnv{qt: qt, br: br, conn: conn}, nil
}

// queue declares a berth queue (berth's topology, the env's queue type).
func (e *rabbitEnv) queue(ctx context.Context, name string) (string, error) {
	q := fmt.Sprintf("berthbench_%s_%s_%d", name, e.qt, time.Now().UnixNano()%1e9)
	if err := e.br.DeclareQueue(ctx, q); err != nil {
		return "", err
	}
	e.berthQ = append(e.berthQ, q)
	return q, nil
}

func (e *rabbitEnv) close() {
	ctx := context.Background()
	for _, q := range e.berthQ {
		_ = e.br.DeleteQueue(ctx, q)
	}
	if ch, err := e.conn.Channel(); err == nil {
		for _, q := range e.rawQ {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_ = ch.Close()
	}
	_ = e.conn.Close()
	_ = e.br.Close()
}

func (e *rabbitEnv) confirmChannel() (*amqp.Channel, error) {
	ch, err := e.conn.Channel()
	if err != nil {
		return nil, err
	}
	return ch, ch.Confirm(false)
}

// rawSliding publishes n messages with the properties berth sets, keeping up
// to window confirms outstanding: the best a careful amqp091-go user writes.
func rawSliding(ctx context.Context, ch *amqp.Channel, q string, n int, body []byte) error {
	ring := make([]*amqp.DeferredConfirmation, 0, window)
	head := 0
	wait := func(dc *amqp.DeferredConfirmation) error {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("confirm: %v %v", ok, err)
		}
		return nil
	}
	for range n {
		if len(ring) == window {
			if err := wait(ring[head]); err != nil {
				return err
			}
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: sdk.NewID(), Type: "bench", CorrelationId: sdk.NewID(), Body: body,
		})
		if err != nil {
			return err
		}
		if len(ring) < window {
			ring = append(ring, dc)
		} else {
			ring[head] = dc
			head = (head + 1) % window
		}
	}
	for _, dc := range ring {
		if err := wait(dc); err != nil {
			return err
		}
	}
	return nil
}

// callers runs n jobs on k goroutines.
func callers(k, n int, job func() error) error {
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	var wg sync.WaitGroup
	errc := make(chan error, k)
	for range k {
		wg.Go(func() {
			for range next {
				if err := job(); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

func watermillConfig(qt rabbitmq.QueueType) wamqp.Config {
	cfg := wamqp.NewDurableQueueConfig(rabbitURL())
	cfg.Queue.Arguments = amqp.Table{"x-queue-type": string(qt)}
	return cfg
}

func runRabbitPublish(ctx context.Context, c config) ([]table, error) {
	var tables []table
	for _, qt := range []rabbitmq.QueueType{rabbitmq.Classic, rabbitmq.Quorum} {
		t, err := rabbitPublish(ctx, c, qt)
		if err != nil {
			return nil, err
		}
		tables = append(tables, t)
	}
	return tables, nil
}

func rabbitPublish(ctx context.Context, c config, qt rabbitmq.QueueType) (table, error) {
	e, err := newRabbitEnv(ctx, qt)
	if err != nil {
		return table{}, err
	}
	defer e.close()
	body := make([]byte, bodySize)
	rawQ, err := e.queue(ctx, "rawpub")
	if err != nil {
		return table{}, err
	}
	ch, err := e.confirmChannel()
	if err != nil {
		return table{}, err
	}
	qs := map[string]string{}
	for _, name := range []string{"async", "n256", "n8"} {
		if qs[name], err = e.queue(ctx, name); err != nil {
			return table{}, err
		}
	}
	raw := variant{name: "raw amqp091-go, sliding window", config: "one goroutine, PublishWithDeferredConfirm, up to 256 confirms outstanding, persistent, mandatory, ID + type + correlation ID", round: func(ctx context.Context, n int) (time.Duration, error) {
		return timed(func() error { return rawSliding(ctx, ch, rawQ, n, body) })
	}}
	async := variant{name: "berth PublishAsync, one goroutine", config: "MaxInFlight 256; every result awaited at the end of the round", round: func(ctx context.Context, n int) (time.Duration, error) {
		return timed(func() error {
			results := make([]*sdk.PublishResult, 0, n)
			for range n {
				r, err := e.br.PublishAsync(ctx, qs["async"], &sdk.Message{Type: "bench", Body: body})
				if err != nil {
					return err
				}
				results = append(results, r)
			}
			for _, r := range results {
				if err := r.Wait(ctx); err != nil {
					return err
				}
			}
			return nil
		})
	}}
	perCall := func(k int, q string) func(ctx context.Context, n int) (time.Duration, error) {
		return func(ctx context.Context, n int) (time.Duration, error) {
			return timed(func() error {
				return callers(k, n, func() error { return e.br.Publish(ctx, q, &sdk.Message{Type: "bench", Body: body}) })
			})
		}
	}
	n256 := variant{name: "berth Publish, 256 goroutines × 1 message", config: "each call waits for its confirm; the calls share one confirm channel", round: perCall(256, qs["n256"])}
	n8 := variant{name: "berth Publish, 8 goroutines × 1 message", config: "as above, 8 callers: bound by confirm latency", round: perCall(8, qs["n8"])}

	// Watermill, tuned: 8 publishing goroutines, confirms, a channel pool.
	wcfg := watermillConfig(qt)
	wcfg.Publish.ConfirmDelivery = true
	wcfg.Publish.ChannelPoolSize = 8
	wpub, err := wamqp.NewPublisher(wcfg, watermill.NopLogger{})
	if err != nil {
		return table{}, err
	}
	defer wpub.Close()
	wq := fmt.Sprintf("berthbench_wm_%s_%d", qt, time.Now().UnixNano()%1e9)
	e.rawQ = append(e.rawQ, wq)
	if err := watermillDeclare(watermillConfig(qt), wq); err != nil {
		return table{}, err
	}
	wm := variant{name: "Watermill AMQP publisher, 8 goroutines", config: "watermill-amqp v3 durable queue config, ConfirmDelivery, ChannelPoolSize 8, one message per Publish", round: func(ctx context.Context, n int) (time.Duration, error) {
		return timed(func() error {
			return callers(8, n, func() error { return wpub.Publish(wq, message.NewMessage(watermill.NewUUID(), body)) })
		})
	}}
	n := msgs(c, 5000)
	res, err := alternate(ctx, []variant{raw, async, n256, n8, wm}, c.rounds, n)
	if err != nil {
		return table{}, err
	}
	// The bound confirm latency sets for 8 callers: 8 ÷ median latency of
	// one publish-and-confirm.
	lat, err := confirmLatency(ctx, ch, rawQ, body, msgs(c, 300))
	if err != nil {
		return table{}, err
	}
	rs := rows(res, 0)
	bound := 8 / lat.Seconds()
	rs[3][4] += fmt.Sprintf("; bound 8 ÷ median confirm latency (%s) = %s msgs/s, reached **%.2f**", lat.Round(10*time.Microsecond), rateStr(bound), res[3].rate()/bound)
	return table{
		title: fmt.Sprintf("RabbitMQ publish, %s queues (256 B, persistent, confirms)", qt),
		intro: fmt.Sprintf("%d messages a round per variant; × is against the raw sliding window.", n),
		head:  resultHead,
		rows:  rs,
	}, nil
}

// confirmLatency is the median time of one publish and its confirm.
func confirmLatency(ctx context.Context, ch *amqp.Channel, q string, body []byte, n int) (time.Duration, error) {
	ds := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
		if err != nil {
			return 0, err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return 0, fmt.Errorf("confirm: %v %v", ok, err)
		}
		ds = append(ds, time.Since(start))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2], nil
}

func runRabbitConsume(ctx context.Context, c config) ([]table, error) {
	var tables []table
	for _, qt := range []rabbitmq.QueueType{rabbitmq.Classic, rabbitmq.Quorum} {
		t, err := rabbitConsume(ctx, c, qt)
		if err != nil {
			return nil, err
		}
		tables = append(tables, t)
	}
	return tables, nil
}

func rabbitConsume(ctx context.Context, c config, qt rabbitmq.QueueType) (table, error) {
	e, err := newRabbitEnv(ctx, qt)
	if err != nil {
		return table{}, err
	}
	defer e.close()
	body := make([]byte, bodySize)
	pub, err := e.confirmChannel()
	if err != nil {
		return table{}, err
	}
	// raw: a channel with prefetch 100, Consume, ack one by one; and with
	// multiple acks every 50 deliveries. Each round fills the queue first
	// (untimed), then opens the consumer and times the drain: no variant
	// consumes while its queue fills.
	costs := map[string]*drainCost{}
	rawVariant := func(name string, every int) (variant, error) {
		q, err := e.queue(ctx, "rawcons")
		if err != nil {
			return variant{}, err
		}
		cfg := "a channel with prefetch 100, Consume, basic.ack per delivery"
		if every > 1 {
			cfg = fmt.Sprintf("a channel with prefetch 100, Consume, basic.ack with multiple every %d deliveries (and at the end)", every)
		}
		dc := &drainCost{}
		costs[name] = dc
		return variant{name: name, config: cfg, round: func(ctx context.Context, n int) (time.Duration, error) {
			if err := rawSliding(ctx, pub, q, n, body); err != nil {
				return 0, err
			}
			return costed(dc, rabbitProc, name, n, func() (time.Duration, error) {
				return timed(func() error {
					ch, err := e.conn.Channel()
					if err != nil {
						return err
					}
					defer ch.Close()
					if err := ch.Qos(100, 0, false); err != nil {
						return err
					}
					dels, err := ch.Consume(q, "", false, false, false, false, nil)
					if err != nil {
						return err
					}
					for i := 1; i <= n; i++ {
						d := <-dels
						if i%every == 0 || i == n {
							if err := d.Ack(every > 1); err != nil {
								return err
							}
						}
					}
					return nil
				})
			})
		}}, nil
	}
	raw, err := rawVariant("raw amqp091-go, ack each", 1)
	if err != nil {
		return table{}, err
	}
	rawMulti, err := rawVariant("raw amqp091-go, multiple acks", 50)
	if err != nil {
		return table{}, err
	}

	// berth: a Worker, Concurrency 8, no-op handler, started per round.
	bq, err := e.queue(ctx, "worker")
	if err != nil {
		return table{}, err
	}
	bcost := &drainCost{}
	costs["berth Worker"] = bcost
	berth := variant{name: "berth Worker", config: "Concurrency 8, Options.Prefetch 100, no-op handler; acks coalesced into multiple acks (default AckInterval 2 ms, flushed at 25 waiting)", round: func(ctx context.Context, n int) (time.Duration, error) {
		if err := rawSliding(ctx, pub, bq, n, body); err != nil {
			return 0, err
		}
		return costed(bcost, rabbitProc, "berth Worker", n, func() (time.Duration, error) {
			return timed(func() error {
				cnt := &counter{}
				done := cnt.expect(int64(n))
				w, err := sdk.NewWorker(e.br, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{
					Queue: bq, Concurrency: 8, Observers: []sdk.Observer{ackObserver{cnt}}, Logger: slog.New(slog.DiscardHandler),
				})
				if err != nil {
					return err
				}
				wctx, stop := context.WithCancel(ctx)
				errc := make(chan error, 1)
				go func() { errc <- w.Run(wctx) }()
				<-done
				stop()
				return <-errc
			})
		})
	}}

	// Watermill, tuned concurrent: 8 subscriptions (8 consumer channels),
	// prefetch 100 each, each acking as it goes; subscribed per round.
	wcfg := watermillConfig(qt)
	wcfg.Consume.Qos.PrefetchCount = 100
	wpcfg := watermillConfig(qt)
	wpcfg.Publish.ConfirmDelivery = true
	wpcfg.Publish.ChannelPoolSize = 8
	wpub, err := wamqp.NewPublisher(wpcfg, watermill.NopLogger{})
	if err != nil {
		return table{}, err
	}
	defer wpub.Close()
	wq := fmt.Sprintf("berthbench_wmc_%s_%d", qt, time.Now().UnixNano()%1e9)
	e.rawQ = append(e.rawQ, wq)
	if err := watermillDeclare(wcfg, wq); err != nil {
		return table{}, err
	}
	wcost := &drainCost{}
	costs["Watermill AMQP subscriber, 8 subscriptions"] = wcost
	wm := variant{name: "Watermill AMQP subscriber, 8 subscriptions", config: "watermill-amqp v3 durable queue config, PrefetchCount 100, 8 Subscribe calls (8 channels) each acking per message", round: func(ctx context.Context, n int) (time.Duration, error) {
		if err := callers(8, n, func() error { return wpub.Publish(wq, message.NewMessage(watermill.NewUUID(), body)) }); err != nil {
			return 0, err
		}
		wsub, err := wamqp.NewSubscriber(wcfg, watermill.NopLogger{}) // dials: untimed
		if err != nil {
			return 0, err
		}
		return costed(wcost, rabbitProc, "Watermill", n, func() (time.Duration, error) {
			return timed(func() error {
				sctx, stop := context.WithCancel(ctx)
				cnt := &counter{}
				done := cnt.expect(int64(n))
				var wg sync.WaitGroup
				for range 8 {
					msgsCh, err := wsub.Subscribe(sctx, wq)
					if err != nil {
						stop()
						return err
					}
					wg.Go(func() {
						for m := range msgsCh {
							m.Ack()
							cnt.add()
						}
					})
				}
				<-done
				stop()
				err = wsub.Close()
				wg.Wait()
				return err
			})
		})
	}}
	n := msgs(c, 5000)
	res, err := alternate(ctx, []variant{raw, rawMulti, berth, wm}, c.rounds, n)
	if err != nil {
		return table{}, err
	}
	return table{
		title: fmt.Sprintf("RabbitMQ consume + ack, %s queues (256 B)", qt),
		intro: fmt.Sprintf("Each round first fills the variant's queue with %d messages (untimed), then times draining them. × is against raw, ack each. Per message drained: this process's CPU time (GC included), the RabbitMQ server's (beam.smp), and this process's heap allocations.", n),
		head:  []string{"variant", "msgs/s", "rounds (min–max)", "×", "client CPU/msg", "server CPU/msg", "allocs/msg", "configuration"},
		rows:  costRows(rows(res, 0), costs),
	}, nil
}

// watermillDeclare declares Watermill's queue for topic (its publisher does
// not: a message published before a subscriber declared it is dropped).
func watermillDeclare(cfg wamqp.Config, topic string) error {
	sub, err := wamqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.SubscribeInitialize(topic)
}

// rabbitProc matches the RabbitMQ server's process (the Erlang VM running
// the rabbit application).
func rabbitProc(cmdline string) bool {
	return strings.Contains(cmdline, "beam.smp") && strings.Contains(cmdline, "rabbit")
}
