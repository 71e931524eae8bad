package jetstream

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/berthq/berth/sdk"
)

// startMover starts, once per Broker and queue, the goroutine that moves
// delayed messages to the ready subject when they are due. It runs until
// Close. Several Brokers may move the same queue: the delay consumer hands
// each message to one of them, and the move's Nats-Msg-Id makes a repeated
// move store nothing twice: a move repeated after a lost ack comes one
// delay-consumer AckWait later, within the stream's dedupe window, which
// [Options.Duplicates] keeps at least twice as long. (A move repeated only
// after every mover was down for longer than the window is stored twice:
// delivery is at least once.)
func (b *Broker) startMover(q *queueState) {
	b.mu.Lock()
	if b.movers == nil {
		b.movers = map[string]bool{}
	}
	if b.movers[q.stream] {
		b.mu.Unlock()
		return
	}
	b.movers[q.stream] = true
	b.mu.Unlock()
	b.goOwned(func() { b.move(q) })
}

// move is the mover's loop: it long-polls the delay consumer, naks each
// message not yet due with the time it still has to wait (JetStream holds it
// back that long, on the server), and republishes each due one on the ready
// subject, then acknowledges it.
func (b *Broker) move(q *queueState) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // ends when Close closes b.closing or move returns
		select {
		case <-b.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	for !b.closed.Load() {
		msgs, err := b.fetch(ctx, q, delayConsumerName, 64)
		if errors.Is(err, sdk.ErrClosed) { // nak'ed for the movers of Brokers still open
			b.giveBackAll(q, delayConsumerName, msgs)
			return
		}
		for _, p := range msgs {
			b.moveOne(ctx, q, p.msg)
		}
		if errors.Is(err, sdk.ErrNotFound) { // queue deleted: the next Receive starts a new mover
			b.mu.Lock()
			delete(b.movers, q.stream)
			b.mu.Unlock()
			return
		}
		if err != nil && !b.closed.Load() {
			b.opts.Logger.Warn("berth/jetstream: moving delayed messages", "queue", q.name, "err", err)
			select {
			case <-time.After(time.Second):
			case <-b.closing:
				return
			}
		}
	}
}

func (b *Broker) moveOne(ctx context.Context, q *queueState, m *nats.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		return
	}
	dec, err := decode(m.Header, m.Data, q.stream, meta.Sequence.Stream, meta.Timestamp)
	if err == nil {
		if wait := time.Until(dec.notBefore); wait > 0 {
			_ = b.nc.Publish(m.Reply, nakDelay(wait))
			return
		}
	}
	// Due (or undecodable: the ready side dead-letters it): store it as it
	// is on the ready subject, without JetStream's own headers (Nats-*), as
	// every copy berth stores: its Nats-Msg-Id is the move's, and a publish
	// expectation (Nats-Expected-Last-Sequence, ...) another producer set
	// held when it was stored, and would refuse this copy for ever.
	w := &nats.Msg{Subject: q.ready, Header: nats.Header{}, Data: m.Data}
	for k, v := range m.Header {
		if !strings.HasPrefix(k, "Nats-") {
			w.Header[k] = v
		}
	}
	if err == nil && dec.ignoredA {
		// An attempt berth did not store: not carried over to the ready
		// copy either, whose move ID would make it look like berth's.
		if c, cerr := encode(dec.msg, dec.extra, q.ready, 1, time.Time{}); cerr == nil {
			w.Header[headerEnvelope] = c.Header[headerEnvelope]
		}
	}
	id := internalID(idMove, q.stream, meta.Sequence.Stream)
	if err := b.publishOne(ctx, q.stream, w, id); err != nil {
		if ctx.Err() == nil {
			b.opts.Logger.Warn("berth/jetstream: moving a delayed message; it is tried again", "queue", q.name, "err", err)
			_ = b.nc.Publish(m.Reply, nakDelay(time.Second))
		}
		return
	}
	_ = b.nc.Publish(m.Reply, ackAck)
}
