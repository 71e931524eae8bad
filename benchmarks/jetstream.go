package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// The JetStream scenario runs against the NATS server of scripts/services
// (BERTH_NATS_URL). Raw variants use streams and the durable consumer that
// berth declares (file storage, one replica, explicit acks), on a
// connection of their own, so that both sides write to and read from
// identically configured streams.

const jsWindow = 256 // raw's sliding window of publish acks; berth's MaxInFlight

// jsEnv is a berth broker per variant, a raw connection, and the queues.
type jsEnv struct {
	brokers []*jetstream.Broker
	admin   *jetstream.Broker
	queues  []string
	nc      *nats.Conn
	js      natsjs.JetStream
}

func newJSEnv(ctx context.Context) (*jsEnv, error) {
	admin, err := jetstream.Connect(ctx, natsURL(), jetstream.ConnectOptions{Name: "berthbench-admin"}, jetstream.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(natsURL(), nats.Name("berthbench-raw"))
	if err != nil {
		_ = admin.Close()
		return nil, err
	}
	js, err := natsjs.New(nc, natsjs.WithPublishAsyncMaxPending(4*jsWindow))
	if err != nil {
		nc.Close()
		_ = admin.Close()
		return nil, err
	}
	return &jsEnv{admin: admin, nc: nc, js: js}, nil
}

// broker connects a berth broker of its own (its own connection).
func (e *jsEnv) broker(ctx context.Context, opts jetstream.Options) (*jetstream.Broker, error) {
	opts.Logger = slog.New(slog.DiscardHandler)
	b, err := jetstream.Connect(ctx, natsURL(), jetstream.ConnectOptions{Name: "berthbench"}, opts)
	if err != nil {
		return nil, err
	}
	e.brokers = append(e.brokers, b)
	return b, nil
}

// queue declares a berth queue and returns its name.
func (e *jsEnv) queue(ctx context.Context, name string) (string, error) {
	q := fmt.Sprintf("berthbench_%s_%d", name, time.Now().UnixNano()%1e9)
	if err := e.admin.DeclareQueue(ctx, q); err != nil {
		return "", err
	}
	e.queues = append(e.queues, q)
	return q, nil
}

func (e *jsEnv) close() {
	for _, b := range e.brokers {
		_ = b.Close()
	}
	e.nc.Close()
	for _, q := range e.queues {
		_ = e.admin.DeleteQueue(context.Background(), q)
	}
	_ = e.admin.Close()
}

func runJetStream(ctx context.Context, c config) ([]table, error) {
	pub, err := jsPublish(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	tables := []table{pub}
	for _, confirmed := range []bool{false, true} {
		t, err := jsConsume(ctx, c, confirmed)
		if err != nil {
			return nil, fmt.Errorf("consume: %w", err)
		}
		tables = append(tables, t)
	}
	return tables, nil
}

// rawJSSliding publishes n messages from one goroutine with PublishMsgAsync,
// keeping up to jsWindow acks outstanding (waiting for the oldest only when
// the window is full), each with a Nats-Msg-Id and the type and correlation
// ID as plain NATS headers: what an application without berth sends.
func rawJSSliding(ctx context.Context, js natsjs.JetStream, subject string, n int, body []byte) error {
	ring := make([]natsjs.PubAckFuture, 0, jsWindow)
	head := 0
	wait := func(f natsjs.PubAckFuture) error {
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for range n {
		if len(ring) == jsWindow {
			if err := wait(ring[head]); err != nil {
				return err
			}
		}
		id := sdk.NewID()
		m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{"Type": {"bench"}, "Correlation-Id": {id}}}
		f, err := js.PublishMsgAsync(m, natsjs.WithMsgID(id))
		if err != nil {
			return err
		}
		if len(ring) < jsWindow {
			ring = append(ring, f)
		} else {
			ring[head] = f
			head = (head + 1) % jsWindow
		}
	}
	for _, f := range ring {
		if err := wait(f); err != nil {
			return err
		}
	}
	return nil
}

func jsPublish(ctx context.Context, c config) (table, error) {
	e, err := newJSEnv(ctx)
	if err != nil {
		return table{}, err
	}
	defer e.close()
	body := make([]byte, bodySize)
	rawQ, err := e.queue(ctx, "jsrawpub")
	if err != nil {
		return table{}, err
	}
	rawSubject := e.admin.Subject(rawQ)
	raw := variant{name: "raw nats.go, PublishMsgAsync sliding window", config: fmt.Sprintf("one goroutine, up to %d acks outstanding, Nats-Msg-Id + type + correlation ID headers", jsWindow),
		round: func(ctx context.Context, n int) (time.Duration, error) {
			return timed(func() error { return rawJSSliding(ctx, e.js, rawSubject, n, body) })
		}}
	vs := []variant{raw}
	add := func(name, cfg string, round func(br *jetstream.Broker, q string) func(context.Context, int) (time.Duration, error)) error {
		br, err := e.broker(ctx, jetstream.Options{MaxInFlight: jsWindow})
		if err != nil {
			return err
		}
		q, err := e.queue(ctx, fmt.Sprintf("js%d", len(vs)))
		if err != nil {
			return err
		}
		vs = append(vs, variant{name: name, config: cfg, round: round(br, q)})
		return nil
	}
	msg := func() *sdk.Message { return &sdk.Message{Type: "bench", Body: body} }
	if err := add("berth PublishAsync, one goroutine", fmt.Sprintf("MaxInFlight %d; every result awaited at the end of the round", jsWindow),
		func(br *jetstream.Broker, q string) func(context.Context, int) (time.Duration, error) {
			return func(ctx context.Context, n int) (time.Duration, error) {
				return timed(func() error { return asyncRound(ctx, br, q, n, msg) })
			}
		}); err != nil {
		return table{}, err
	}
	for _, k := range []int{256, 8} {
		cfg := fmt.Sprintf("each call waits for its ack; MaxInFlight %d across the calls", jsWindow)
		if k < jsWindow {
			cfg = "as above, 8 callers: bound by ack latency"
		}
		if err := add(fmt.Sprintf("berth Publish, %d goroutines × 1 message", k), cfg,
			func(br *jetstream.Broker, q string) func(context.Context, int) (time.Duration, error) {
				return func(ctx context.Context, n int) (time.Duration, error) {
					return timed(func() error {
						return callers(k, n, func() error { return br.Publish(ctx, q, msg()) })
					})
				}
			}); err != nil {
			return table{}, err
		}
	}
	if err := add("berth Publish of 256, one goroutine", fmt.Sprintf("Publish with 256 messages at a time: pipelined, MaxInFlight %d, then every ack awaited (stop-and-wait per call)", jsWindow),
		func(br *jetstream.Broker, q string) func(context.Context, int) (time.Duration, error) {
			return func(ctx context.Context, n int) (time.Duration, error) {
				return timed(func() error {
					for sent := 0; sent < n; {
						batch := make([]*sdk.Message, min(256, n-sent))
						for i := range batch {
							batch[i] = msg()
						}
						if err := br.Publish(ctx, q, batch...); err != nil {
							return err
						}
						sent += len(batch)
					}
					return nil
				})
			}
		}); err != nil {
		return table{}, err
	}
	n := msgs(c, 5000)
	res, err := alternate(ctx, vs, c.rounds, n)
	if err != nil {
		return table{}, err
	}
	return table{
		title: "JetStream publish (256 B, file storage, publish acks)",
		intro: fmt.Sprintf("%d messages a round per variant, each variant on a stream of its own (berth's configuration) and a connection of its own. berth carries its fields in one JSON header (Berth-Message) beside Nats-Msg-Id. × is against the raw sliding window.", n),
		head:  resultHead,
		rows:  rows(res, 0),
	}, nil
}

// fillJS publishes n berth messages to q (untimed).
func fillJS(ctx context.Context, br *jetstream.Broker, q string, n int, body []byte) error {
	for sent := 0; sent < n; {
		batch := make([]*sdk.Message, min(256, n-sent))
		for i := range batch {
			batch[i] = &sdk.Message{Type: "bench", Body: body}
		}
		if err := br.Publish(ctx, q, batch...); err != nil {
			return err
		}
		sent += len(batch)
	}
	return nil
}

const jsConcurrency = 8 // the Worker's Concurrency; raw's confirming goroutines

// jsRawBuffer is how many messages raw Consume and Messages buffer (nats.go's
// default PullMaxMessages).
const jsRawBuffer = 500

func jsConsume(ctx context.Context, c config, confirmed bool) (table, error) {
	e, err := newJSEnv(ctx)
	if err != nil {
		return table{}, err
	}
	defer e.close()
	body := make([]byte, bodySize)
	filler, err := e.broker(ctx, jetstream.Options{})
	if err != nil {
		return table{}, err
	}
	rawName, rawCfg := "raw nats.go, Consume + Ack", "Consumer.Consume (default PullMaxMessages 500) on berth's durable consumer, m.Ack() in the callback (not confirmed), connection flushed at the end"
	if confirmed {
		rawName = "raw nats.go, Messages + DoubleAck"
		rawCfg = fmt.Sprintf("Consumer.Messages (default PullMaxMessages 500) on berth's durable consumer, handed to %d goroutines each calling m.DoubleAck (waits for the server)", jsConcurrency)
	}
	// Every round has a queue (stream and consumer) of its own: a pull
	// request left open on the server when a consumer stops takes messages
	// of the next round and hides them for the AckWait.
	raw := variant{name: rawName, config: rawCfg, round: func(ctx context.Context, n int) (time.Duration, error) {
		rawQ, err := e.queue(ctx, "jsrawcons")
		if err != nil {
			return 0, err
		}
		stream, _ := e.admin.StreamNames(rawQ)
		cons, err := e.js.Consumer(ctx, stream, "berth")
		if err != nil {
			return 0, err
		}
		if err := fillJS(ctx, filler, rawQ, n, body); err != nil {
			return 0, err
		}
		if confirmed {
			return timed(func() error { return rawJSDoubleAck(ctx, cons, n) })
		}
		return rawJSConsume(ctx, e.nc, cons, n)
	}}
	br, err := e.broker(ctx, jetstream.Options{AsyncAck: !confirmed})
	if err != nil {
		return table{}, err
	}
	ack := "AsyncAck (not confirmed)"
	if confirmed {
		ack = "default acks (each waits for the server)"
	}
	worker := func(prefetch int, name, how string) variant {
		return variant{name: name, config: fmt.Sprintf("Concurrency %d, %s, no-op handler, %s; the clock stops after Flush (stopping the Worker is not timed)", jsConcurrency, how, ack),
			round: func(ctx context.Context, n int) (time.Duration, error) {
				q, err := e.queue(ctx, "jsworker")
				if err != nil {
					return 0, err
				}
				if err := fillJS(ctx, filler, q, n, body); err != nil {
					return 0, err
				}
				return drainWorker(ctx, br, q, n, sdk.WorkerOptions{Concurrency: jsConcurrency, Prefetch: prefetch})
			}}
	}
	// The default Prefetch holds 2 × Concurrency; raw Consume buffers up to
	// 500, so the Worker is also measured holding as many.
	berth := worker(0, "berth Worker", "default Prefetch")
	berth500 := worker(jsRawBuffer-jsConcurrency, "berth Worker, Prefetch 492", fmt.Sprintf("Prefetch %d (holds up to %d, raw Consume's PullMaxMessages)", jsRawBuffer-jsConcurrency, jsRawBuffer))
	n := msgs(c, 5000)
	res, err := alternate(ctx, []variant{raw, berth, berth500}, c.rounds, n)
	if err != nil {
		return table{}, err
	}
	kind := "unconfirmed acks"
	if confirmed {
		kind = "confirmed acks"
	}
	return table{
		title: fmt.Sprintf("JetStream consume + ack, %s (256 B)", kind),
		intro: fmt.Sprintf("Each round first fills a new queue (stream and durable consumer, declared untimed) with %d berth messages, then times draining them from the start of the consumer. × is against raw.", n),
		head:  resultHead,
		rows:  rows(res, 0),
	}, nil
}

// rawJSConsume drains n messages with Consume, acking each without
// waiting, flushes the connection, and returns how long that took (stopping
// the consumer is not timed, as for the Worker).
func rawJSConsume(ctx context.Context, nc *nats.Conn, cons natsjs.Consumer, n int) (time.Duration, error) {
	start := time.Now()
	var got atomic.Int64
	done := make(chan struct{})
	var ackErr atomic.Value
	cc, err := cons.Consume(func(m natsjs.Msg) {
		if err := m.Ack(); err != nil {
			ackErr.CompareAndSwap(nil, err)
		}
		if got.Add(1) == int64(n) {
			close(done)
		}
	})
	if err != nil {
		return 0, err
	}
	defer cc.Stop()
	select {
	case <-done:
	case <-ctx.Done():
	}
	if err, _ := ackErr.Load().(error); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	err = nc.FlushTimeout(10 * time.Second)
	return time.Since(start), err
}

// rawJSDoubleAck drains n messages with Messages, handing them to
// jsConcurrency goroutines that each confirm their acks.
func rawJSDoubleAck(ctx context.Context, cons natsjs.Consumer, n int) error {
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	ch := make(chan natsjs.Msg, jsConcurrency)
	var wg sync.WaitGroup
	errc := make(chan error, jsConcurrency+1)
	for range jsConcurrency {
		wg.Go(func() {
			failed := false
			for m := range ch { // after a failure, keep taking so that the feed never blocks
				if err := m.DoubleAck(ctx); err != nil && !failed {
					failed = true
					errc <- err
				}
			}
		})
	}
	for range n {
		m, err := it.Next()
		if err != nil {
			errc <- err
			break
		}
		ch <- m
	}
	close(ch)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}
