package jetstream

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/sdk"
)

// Publish sends msgs to queue and returns once JetStream has stored every
// one (its publish ack), declaring the queue on first use. Publishes are
// pipelined: every message is sent without waiting for the previous ack, with
// at most [Options.MaxInFlight] acks outstanding across the Broker. Each
// carries its ID as Nats-Msg-Id, so a retried Publish within the stream's
// [Options.Duplicates] window stores nothing twice (and neither does a
// second Publish of a message with the same explicit ID within it).
// Messages with a Delay go to the queue's delayed subject and are moved to
// the ready one when due (see the package doc).
//
// Messages JetStream refuses are reported in an [*sdk.PublishError]; the
// others were stored. When ctx ends first, Publish returns ctx.Err() and
// the messages whose ack had not arrived may or may not be stored.
func (b *Broker) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := sdk.PrepareAll(ctx, queue, msgs, b.opts.MaxMessageSize); err != nil {
		return err
	}
	wire := make([]*nats.Msg, len(msgs))
	now := time.Now()
	q := b.names(queue) // subjects only: declared below, after validation
	for i, m := range msgs {
		if err := validate(m); err != nil {
			return err
		}
		subject, notBefore := q.ready, time.Time{}
		if m.Delay > 0 {
			subject, notBefore = q.delayed, now.Add(m.Delay)
		}
		w, err := encode(m, subject, 1, notBefore)
		if err != nil {
			return err
		}
		if n, limit := wireSize(w), int(b.nc.MaxPayload()); n > limit {
			return &sdk.MessageTooLargeError{ID: m.ID, Size: n, Limit: limit}
		}
		wire[i] = w
	}
	if err := b.connected("publish"); err != nil {
		return err
	}
	qs, err := b.queue(ctx, queue)
	if err != nil {
		return err
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = msgID(m.ID)
	}
	return b.publishWire(ctx, qs.stream, wire, ids, func(i int) string { return msgs[i].ID })
}

// publishWire publishes wire[i] with Nats-Msg-Id ids[i], pipelined and
// bounded by the Broker's slots, and waits for every ack. name(i) names
// message i in a PublishError.
func (b *Broker) publishWire(ctx context.Context, _ string, wire []*nats.Msg, ids []string, name func(int) string) error {
	type pending struct {
		i   int
		fut jetstream.PubAckFuture
	}
	var (
		inflight []pending
		failed   map[string]error
	)
	fail := func(i int, err error) {
		if failed == nil {
			failed = map[string]error{}
		}
		failed[name(i)] = b.wrapErr(ctx, "publish", err)
	}
	// await waits for the oldest outstanding ack and frees its slot.
	await := func() error {
		p := inflight[0]
		inflight = inflight[1:]
		defer func() { <-b.slots }()
		select {
		case <-p.fut.Ok():
		case err := <-p.fut.Err():
			fail(p.i, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-b.closing:
			return sdk.ErrClosed
		}
		return nil
	}
	abandon := func() {
		for range inflight {
			<-b.slots
		}
		inflight = nil
	}
	for i, w := range wire {
	acquire:
		for {
			select {
			case b.slots <- struct{}{}:
				break acquire
			default:
			}
			if len(inflight) > 0 {
				if err := await(); err != nil {
					abandon()
					return err
				}
				continue
			}
			select {
			case b.slots <- struct{}{}:
				break acquire
			case <-ctx.Done():
				return ctx.Err()
			case <-b.closing:
				return sdk.ErrClosed
			}
		}
		fut, err := b.js.PublishMsgAsync(w, jetstream.WithMsgID(ids[i]))
		if err != nil {
			<-b.slots
			if errors.Is(err, nats.ErrConnectionClosed) && b.closed.Load() {
				abandon()
				return sdk.ErrClosed
			}
			fail(i, err)
			continue
		}
		inflight = append(inflight, pending{i: i, fut: fut})
	}
	for len(inflight) > 0 {
		if err := await(); err != nil {
			abandon()
			return err
		}
	}
	if failed != nil {
		return &sdk.PublishError{Failed: failed}
	}
	return nil
}

// publishOne publishes one prepared NATS message and waits for its ack.
func (b *Broker) publishOne(ctx context.Context, stream string, w *nats.Msg, id string) error {
	err := b.publishWire(ctx, stream, []*nats.Msg{w}, []string{id}, func(int) string { return id })
	var pe *sdk.PublishError
	if errors.As(err, &pe) {
		for _, e := range pe.Failed {
			return e
		}
	}
	return err
}

var _ sdk.AsyncPublisher = (*Broker)(nil)

// asyncAck is one PublishAsync message awaiting its ack.
type asyncAck struct {
	fut jetstream.PubAckFuture
	res *sdk.PublishResult
}

// PublishAsync publishes msg with nats.go's asynchronous publish and returns
// at once; the result resolves when JetStream acks the message (nil), refuses
// it, or the ack times out (5s, an error wrapping [sdk.ErrUnavailable]; the
// message may be stored, and publishing it again is deduplicated by its
// Nats-Msg-Id within [Options.Duplicates]). It shares the Broker's
// [Options.MaxInFlight] acks with Publish: beyond them it blocks until an
// ack frees a slot or ctx ends (ctx.Err(), nothing published). Results
// still unresolved when the Broker closes resolve with [sdk.ErrClosed].
// Validation errors return at once, as with Publish. It adds no latency of
// its own: the message is in the connection's write buffer when
// PublishAsync returns (nats.go flushes it from its own goroutine) and the
// result resolves with the ack, one round trip to the server later.
func (b *Broker) PublishAsync(ctx context.Context, queue string, msg *sdk.Message) (*sdk.PublishResult, error) {
	if b.closed.Load() {
		return nil, sdk.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := sdk.Prepare(ctx, queue, msg, b.opts.MaxMessageSize); err != nil {
		return nil, err
	}
	if err := validate(msg); err != nil {
		return nil, err
	}
	q := b.names(queue)
	subject, notBefore := q.ready, time.Time{}
	if msg.Delay > 0 {
		subject, notBefore = q.delayed, time.Now().Add(msg.Delay)
	}
	w, err := encode(msg, subject, 1, notBefore)
	if err != nil {
		return nil, err
	}
	if n, limit := wireSize(w), int(b.nc.MaxPayload()); n > limit {
		return nil, &sdk.MessageTooLargeError{ID: msg.ID, Size: n, Limit: limit}
	}
	if err := b.connected("publish"); err != nil {
		return nil, err
	}
	if _, err := b.queue(ctx, queue); err != nil {
		return nil, err
	}
	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.closing:
		return nil, sdk.ErrClosed
	}
	// Publish and enqueue under mu, so that Close (which sets closed under
	// mu) finds every accepted message in the queue it drains, in order.
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		<-b.slots
		return nil, sdk.ErrClosed
	}
	if !b.resolving {
		b.resolving = true
		b.acks = make(chan asyncAck, b.opts.MaxInFlight)
		b.wg.Add(1)
		go b.resolveAcks(b.acks)
	}
	fut, err := b.js.PublishMsgAsync(w, jetstream.WithMsgID(msgID(msg.ID)))
	if err != nil {
		b.mu.Unlock()
		<-b.slots
		return nil, b.wrapErr(ctx, "publish", err)
	}
	res := sdk.NewPublishResult(msg.ID)
	b.acks <- asyncAck{fut: fut, res: res} // room: every entry holds a slot
	b.mu.Unlock()
	return res, nil
}

// resolveAcks resolves PublishAsync results as their acks arrive (in
// publish order, as JetStream sends them) and frees their slots; after
// Close it resolves the rest with sdk.ErrClosed.
func (b *Broker) resolveAcks(acks chan asyncAck) {
	defer b.wg.Done()
	for {
		select {
		case a := <-acks:
			select {
			case <-a.fut.Ok():
				a.res.Resolve(nil)
			case err := <-a.fut.Err():
				a.res.Resolve(b.wrapErr(context.Background(), "publish", err))
			case <-b.closing:
				a.res.Resolve(sdk.ErrClosed)
			}
			<-b.slots
		case <-b.closing:
			for {
				select {
				case a := <-acks:
					a.res.Resolve(sdk.ErrClosed)
					<-b.slots
				default:
					return
				}
			}
		}
	}
}
