package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

const memConcurrency = 16

// memBacklog is the MaxBacklog of the bounded berth variant: ten of the
// producer's batches.
const memBacklog = 1024

// counter counts the Worker's acks and wakes whoever waits for a target.
// A count is one atomic add, as the channel baseline's sink is: a mutex
// taken by every handler goroutine for every message would charge the
// measured side a contended lock the baseline does not take.
type counter struct {
	n     atomic.Int64
	round atomic.Pointer[countRound] // the target waited for; nil before the first expect

	mu    sync.Mutex // serialises expect
	total int64      // the sum of the targets so far
}

// countRound is one expect's target and the channel closed once n reaches it.
type countRound struct {
	target int64
	done   chan struct{}
	closed atomic.Bool
}

func (r *countRound) finish() {
	if r.closed.CompareAndSwap(false, true) {
		close(r.done)
	}
}

// expect raises the target by more and returns a channel closed once the
// count reaches it (at once if it already has).
func (c *counter) expect(more int64) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += more
	r := &countRound{target: c.total, done: make(chan struct{})}
	c.round.Store(r)
	if c.n.Load() >= r.target { // counts that came before the round's target was set
		r.finish()
	}
	return r.done
}

func (c *counter) add() {
	n := c.n.Add(1)
	if r := c.round.Load(); r != nil && n >= r.target {
		r.finish()
	}
}

// ackObserver feeds a counter from the Worker's settlements.
type ackObserver struct{ c *counter }

func (a ackObserver) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }
func (a ackObserver) Settled(_ context.Context, _ sdk.Delivery, s sdk.Settlement) {
	if s.Action == sdk.ActionAck && s.Err == nil {
		a.c.add()
	}
}

func runMemory(ctx context.Context, c config) ([]table, error) {
	body := make([]byte, 256)

	// A buffered channel feeding 16 goroutines that do nothing.
	channel := variant{name: "Go channel", config: "capacity 32, 16 consumer goroutines, no-op", round: func(ctx context.Context, n int) (time.Duration, error) {
		ch := make(chan []byte, 32)
		var wg sync.WaitGroup
		var sink atomic.Int64
		start := time.Now()
		for range memConcurrency {
			wg.Go(func() {
				for b := range ch {
					sink.Add(int64(len(b)))
				}
			})
		}
		for range n {
			ch <- body
		}
		close(ch)
		wg.Wait()
		return time.Since(start), nil
	}}

	// berth: memory broker + Worker, producer publishing in batches of 100;
	// once with an unbounded queue, once with MaxBacklog, which holds the
	// producer back as the channel's and GoChannel's buffers do theirs.
	var berths []variant
	for _, backlog := range []int{0, memBacklog} {
		br, err := memory.New(memory.Options{MaxBacklog: backlog})
		if err != nil {
			return nil, err
		}
		defer br.Close()
		cnt := &counter{}
		w, err := sdk.NewWorker(br, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), sdk.WorkerOptions{
			Queue: "bench", Concurrency: memConcurrency, Observers: []sdk.Observer{ackObserver{cnt}}, Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			return nil, err
		}
		wctx, stop := context.WithCancel(ctx)
		werr := make(chan error, 1)
		go func() { werr <- w.Run(wctx) }()
		defer func() { stop(); <-werr }()
		name, config := "berth Worker, memory broker", "Concurrency 16, default Prefetch, no-op handler; publisher: one goroutine, Publish of 100 at a time while the Worker consumes; no MaxBacklog (the queue grows while the publisher is ahead)"
		if backlog > 0 {
			name = fmt.Sprintf("berth Worker, memory broker, MaxBacklog %d", backlog)
			config = fmt.Sprintf("as above, with MaxBacklog %d: Publish waits while the queue holds that many", backlog)
		}
		berths = append(berths, variant{name: name, config: config, round: func(ctx context.Context, n int) (time.Duration, error) {
			start := time.Now()
			done := cnt.expect(int64(n))
			for sent := 0; sent < n; {
				batch := make([]*sdk.Message, min(100, n-sent))
				for i := range batch {
					batch[i] = &sdk.Message{Type: "bench", Body: body}
				}
				if err := br.Publish(ctx, "bench", batch...); err != nil {
					return 0, err
				}
				sent += len(batch)
			}
			<-done
			return time.Since(start), nil
		}})
	}

	// Watermill: GoChannel pub/sub and a Router with a no-op handler.
	logger := watermill.NopLogger{}
	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 32}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return nil, err
	}
	wcnt := &counter{}
	router.AddConsumerHandler("bench", "bench", pubsub, func(*message.Message) error { wcnt.add(); return nil })
	rctx, rstop := context.WithCancel(ctx)
	rerr := make(chan error, 1)
	go func() { rerr <- router.Run(rctx) }()
	<-router.Running()
	defer func() { rstop(); <-rerr; _ = pubsub.Close() }()
	wm := variant{name: "Watermill Router, GoChannel", config: "GoChannel OutputChannelBuffer 32, Router with one no-op handler (Watermill handles a subscription's messages one at a time), publisher: Publish of 100 at a time", round: func(ctx context.Context, n int) (time.Duration, error) {
		start := time.Now()
		done := wcnt.expect(int64(n))
		for sent := 0; sent < n; {
			batch := make([]*message.Message, min(100, n-sent))
			for i := range batch {
				batch[i] = message.NewMessage(watermill.NewUUID(), body)
			}
			if err := pubsub.Publish("bench", batch...); err != nil {
				return 0, err
			}
			sent += len(batch)
		}
		<-done
		return time.Since(start), nil
	}}
	res, err := alternate(ctx, []variant{channel, berths[0], berths[1], wm}, c.rounds, msgs(c, 200000))
	if err != nil {
		return nil, err
	}
	return []table{{
		title: "memory — Worker vs a Go channel vs Watermill GoChannel (publish + consume, 256 B)",
		intro: fmt.Sprintf("End to end: a producer and the consumers run together; %d messages a round. × is against the channel.", msgs(c, 200000)),
		head:  resultHead,
		rows:  rows(res, 0),
	}}, nil
}
