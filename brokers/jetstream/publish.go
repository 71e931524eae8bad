package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
// When no stream answers, Publish looks the queue's stream and consumers up
// (for at most 2 s): when one is gone (another process deleted the queue)
// it declares the queue again, and when they are there it does not; either
// way it publishes the failed messages once more. With [Options.NoDeclare]
// a missing stream is an error wrapping [sdk.ErrNotFound]. A lookup that
// fails or gets no answer (a replicated stream electing a leader after its
// node died answers nothing for seconds) is an error wrapping
// [sdk.ErrUnavailable]: retry the same messages (deduplicated). When no
// stream answers a PublishAsync, its result fails and the next call on the
// queue looks it up first.
//
// A message whose NATS form would leave no room within the server's
// max_payload for the copies berth stores of it (see [Options.MaxMessageSize])
// is refused with an [*sdk.MessageTooLargeError] before anything is sent.
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
	q := b.subjects(queue) // subjects only: declared below, after validation
	for i, m := range msgs {
		if err := validate(m); err != nil {
			return err
		}
		subject, notBefore := q.ready, time.Time{}
		if m.Delay > 0 {
			subject, notBefore = q.delayed, now.Add(m.Delay)
		}
		w, err := encode(m, nil, subject, 1, notBefore)
		if err != nil {
			return err
		}
		if n, limit := wireSize(w, msgID(m.ID)), b.payloadLimit()-copyReserve(q.stream); n > limit {
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
	err = b.publishTo(ctx, qs, wire, msgs)
	var pe *sdk.PublishError
	if !errors.As(err, &pe) || !streamGone(err) {
		return err
	}
	// No stream answered: the queue's stream is gone (another process
	// deleted the queue), or, in a cluster, it had no leader for the
	// moment. Only a stream JetStream says is not there is declared again
	// (with NoDeclare: ErrNotFound; see recheck). Either way the messages
	// that failed so are published once more.
	if qs, err = b.recheck(ctx, qs); err != nil {
		return err
	}
	var (
		again     []*nats.Msg
		againMsgs []*sdk.Message
		failed    = map[string]error{}
	)
	for i, m := range msgs {
		if ferr, ok := pe.Failed[m.ID]; ok {
			if streamGone(ferr) {
				again, againMsgs = append(again, wire[i]), append(againMsgs, m)
			} else {
				failed[m.ID] = ferr
			}
		}
	}
	if len(again) > 0 {
		err = b.publishTo(ctx, qs, again, againMsgs)
		if !errors.As(err, &pe) {
			if err != nil || len(failed) == 0 {
				return err
			}
		} else {
			for id, ferr := range pe.Failed {
				failed[id] = ferr
			}
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return &sdk.PublishError{Failed: failed}
}

// publishTo publishes the encoded wire[i] of msgs[i] to the declared queue
// qs and waits for their acks.
func (b *Broker) publishTo(ctx context.Context, qs *queueState, wire []*nats.Msg, msgs []*sdk.Message) error {
	if len(wire) == 1 { // the common call: one message, through PublishAsync's cheaper path
		return b.publishSingle(ctx, wire[0], msgs[0].ID)
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = msgID(m.ID)
	}
	return b.publishWire(ctx, qs.stream, wire, ids, func(i int) string { return msgs[i].ID })
}

// streamGone reports a publish that no stream answered: JetStream stores
// nothing on the subject, the queue's stream is not there (or, briefly,
// JetStream is not answering).
func streamGone(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// goneCheckTimeout bounds queueMissing's lookups.
const goneCheckTimeout = 2 * time.Second

// queueMissing reports whether the stream of q, one of its consumers or its
// dead-letter stream is not there (another process deleted it); false when
// they are. It is asked when a publish found no stream to answer (a
// dead letter's included), or a pull no consumer (q marked suspect). It returns an error wrapping [sdk.ErrUnavailable]
// when a lookup fails or gets no answer within goneCheckTimeout. A
// replicated stream or consumer whose leader's node died answers nothing,
// publishes, pulls and lookups alike, until its group elects another
// leader (seconds): nats.go reports its publishes as it reports a missing
// stream's, and the declaration that followed sent its lookups to the
// leaderless stream, which dropped them unanswered, so Publish waited until
// its caller's context ended (and declared the queue again for nothing).
// Now the caller hears that JetStream is unavailable, and retries (the same
// messages are deduplicated by their Nats-Msg-Id).
func (b *Broker) queueMissing(ctx context.Context, q *queueState) (bool, error) {
	lctx, cancel := context.WithTimeout(ctx, goneCheckTimeout)
	defer cancel()
	_, err := b.js.Stream(lctx, q.stream)
	for _, c := range [...]string{consumerName, delayConsumerName} {
		if err != nil {
			break
		}
		_, err = b.js.Consumer(lctx, q.stream, c)
	}
	if err == nil {
		_, err = b.js.Stream(lctx, q.dlq)
	}
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
		return true, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	case b.closed.Load():
		return false, sdk.ErrClosed
	}
	return false, fmt.Errorf("berth/jetstream: queue %s: %w: looking up stream %s, its consumers and dead-letter stream failed: %w",
		sdk.ErrorText(q.name), sdk.ErrUnavailable, q.stream, err)
}

// recheck returns the state of q's queue once a publish to it found no
// stream to answer, or a pull no consumer (q is then marked suspect, see
// suspectGone and Receive): q itself when its stream and consumers are
// there, the queue declared again when JetStream says one is not (another
// process deleted it), and an error wrapping [sdk.ErrUnavailable] when they
// cannot be looked up (see queueMissing).
func (b *Broker) recheck(ctx context.Context, q *queueState) (*queueState, error) {
	missing, err := b.queueMissing(ctx, q)
	switch {
	case err != nil:
		return nil, err
	case missing:
		return b.redeclare(ctx, q)
	}
	q.suspect.Store(false)
	return q, nil
}

// redeclare declares q's queue again, whose declared entry q is stale: one
// of its streams was deleted by another process (a publish no stream
// answered). With [Options.NoDeclare] it creates nothing.
func (b *Broker) redeclare(ctx context.Context, q *queueState) (*queueState, error) {
	b.declared.CompareAndDelete(q.name, q)
	return b.queue(ctx, q.name)
}

// suspectGone marks suspect the declared entry of the queue whose subject
// a publish went to when no stream answered it, so that the next call on
// the queue looks its stream up first (recheck) and declares it again if
// it is gone (PublishAsync cannot retry: its result is already out). It
// used to drop the entry: the next call then declared the queue at once,
// and during a stream leader election that declaration's lookup went
// unanswered until the caller's context ended.
func (b *Broker) suspectGone(subject string, err error) {
	if !streamGone(err) {
		return
	}
	for _, kind := range [...]string{".q.", ".d."} {
		if esc, ok := strings.CutPrefix(subject, b.opts.Prefix+kind); ok {
			if queue, ok := unescape(esc); ok {
				if q, ok := b.declared.Load(queue); ok {
					q.(*queueState).suspect.Store(true)
				}
			}
			return
		}
	}
}

// publishSingle publishes one message as Publish does, with its result
// resolved in nats.go's callback rather than by a future of its own.
func (b *Broker) publishSingle(ctx context.Context, w *nats.Msg, id string) error {
	res, _, refused, err := b.publishTracked(ctx, w, id, msgID(id))
	if refused {
		return &sdk.PublishError{Failed: map[string]error{id: err}}
	}
	if err != nil {
		return err
	}
	select {
	case <-res.Done():
		if err := res.Err(); err != nil {
			return &sdk.PublishError{Failed: map[string]error{id: err}}
		}
		return nil
	case <-ctx.Done():
		return ctx.Err() // the ack may still come: the message may be stored
	case <-b.closing:
		return sdk.ErrClosed
	}
}

// publishWire publishes wire[i] with Nats-Msg-Id ids[i], pipelined and
// bounded by the Broker's slots, and waits for every ack. name(i) names
// message i in a PublishError.
//
// Each message keeps its slot until its outcome (ack, error, ack timeout,
// reconnection or Close: asyncDone or failPending), also when ctx ends
// first and publishWire returns without it: the message is still in
// flight, and nats.go bounds its pending acks too (4 × MaxInFlight, beyond
// which a publish fails with an error that is not ErrUnavailable). Slots
// given back early let abandoned calls fill that bound, and a later publish
// failed instead of waiting.
func (b *Broker) publishWire(ctx context.Context, _ string, wire []*nats.Msg, ids []string, name func(int) string) error {
	var (
		results = make([]*sdk.PublishResult, len(wire))
		failed  map[string]error
	)
	fail := func(i int, err error) {
		if failed == nil {
			failed = map[string]error{}
		}
		failed[name(i)] = err
	}
	for i, w := range wire {
		res, _, refused, err := b.publishTracked(ctx, w, name(i), ids[i])
		if refused {
			fail(i, err)
			continue
		}
		if err != nil {
			return err // ctx.Err() or ErrClosed
		}
		results[i] = res
	}
	for i, res := range results {
		if res == nil {
			continue
		}
		select {
		case <-res.Done():
			if err := res.Err(); err != nil {
				fail(i, err)
			}
		case <-ctx.Done():
			return ctx.Err() // the acks may still come: the messages may be stored
		case <-b.closing:
			return sdk.ErrClosed
		}
	}
	if failed != nil {
		return &sdk.PublishError{Failed: failed}
	}
	return nil
}

// publishOne publishes one prepared NATS message and waits for its ack.
func (b *Broker) publishOne(ctx context.Context, _ string, w *nats.Msg, id string) error {
	_, err := b.publishAcked(ctx, w, id)
	return err
}

// publishAcked is publishOne (w with Nats-Msg-Id id, an internal one),
// returning JetStream's publish ack: the stream sequence of the message
// stored, or, when it is a duplicate, of the one stored before with id.
func (b *Broker) publishAcked(ctx context.Context, w *nats.Msg, id string) (*jetstream.PubAck, error) {
	res, paf, refused, err := b.publishTracked(ctx, w, id, id)
	if refused {
		return nil, err
	}
	if err != nil {
		return nil, err // ctx.Err() or ErrClosed
	}
	select {
	case <-res.Done():
		if err := res.Err(); err != nil {
			return nil, err
		}
	case <-ctx.Done():
		return nil, ctx.Err() // the ack may still come: the message may be stored
	case <-b.closing:
		return nil, sdk.ErrClosed
	}
	// res resolves nil only in the ack callback, which nats.go calls once
	// the future holds the ack.
	select {
	case pa := <-paf.Ok():
		return pa, nil
	default:
		return nil, errors.New("berth/jetstream: publish: acked without a publish ack")
	}
}

var _ sdk.AsyncPublisher = (*Broker)(nil)

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
	q := b.subjects(queue)
	subject, notBefore := q.ready, time.Time{}
	if msg.Delay > 0 {
		subject, notBefore = q.delayed, time.Now().Add(msg.Delay)
	}
	w, err := encode(msg, nil, subject, 1, notBefore)
	if err != nil {
		return nil, err
	}
	if n, limit := wireSize(w, msgID(msg.ID)), b.payloadLimit()-copyReserve(q.stream); n > limit {
		return nil, &sdk.MessageTooLargeError{ID: msg.ID, Size: n, Limit: limit}
	}
	if err := b.connected("publish"); err != nil {
		return nil, err
	}
	if _, err := b.queue(ctx, queue); err != nil {
		return nil, err
	}
	res, _, _, err := b.publishTracked(ctx, w, msg.ID, msgID(msg.ID))
	return res, err
}

// publishTracked takes a slot, publishes w (message id, with Nats-Msg-Id
// natsID) with nats.go's asynchronous publish and returns the result that
// asyncDone resolves with its outcome; the slot is freed with it. paf is
// nats.go's future of the publish, which holds the publish ack once res has
// resolved nil. refused reports that nats.go refused the publish (err is
// its error, wrapped); the other errors are ctx's and ErrClosed.
func (b *Broker) publishTracked(ctx context.Context, w *nats.Msg, id, natsID string) (res *sdk.PublishResult, paf jetstream.PubAckFuture, refused bool, err error) {
	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, false, ctx.Err()
	case <-b.closing:
		return nil, nil, false, sdk.ErrClosed
	}
	// Registered before the publish, so that an ack arriving at once finds
	// it; under pendMu with the closed check, so that Close (which sets
	// closed before it takes the map) resolves every accepted message.
	res = sdk.NewPublishResult(id)
	b.pendMu.Lock()
	if b.closed.Load() {
		b.pendMu.Unlock()
		<-b.slots
		return nil, nil, false, sdk.ErrClosed
	}
	b.pending[w] = res
	b.pendMu.Unlock()
	paf, err = b.js.PublishMsgAsync(w, jetstream.WithMsgID(natsID))
	if err != nil {
		if b.takePending(w) == nil {
			// Resolved meanwhile, its slot freed: by Close, or by nats.go's
			// error callback (its pending acks are failed on a reconnection).
			if b.closed.Load() {
				return nil, nil, false, sdk.ErrClosed
			}
			return nil, nil, true, b.wrapErr(ctx, "publish", err)
		}
		<-b.slots
		if errors.Is(err, nats.ErrConnectionClosed) && b.closed.Load() {
			return nil, nil, false, sdk.ErrClosed
		}
		return nil, nil, true, b.wrapErr(ctx, "publish", err)
	}
	return res, paf, false, nil
}

// takePending removes and returns the result of w (a Publish's message or
// a PublishAsync one), nil when there is none (already resolved).
func (b *Broker) takePending(w *nats.Msg) *sdk.PublishResult {
	b.pendMu.Lock()
	res := b.pending[w]
	if res != nil {
		delete(b.pending, w)
	}
	b.pendMu.Unlock()
	return res
}

// asyncDone is nats.go's callback for the outcome of every asynchronous
// publish of the connection's JetStream context (ack, error, ack timeout,
// ack lost to a reconnect): it resolves the message's result (Publish's
// and PublishAsync's alike, see publishTracked) and frees its slot. It
// runs on nats.go's reply goroutine, and does not block.
func (b *Broker) asyncDone(w *nats.Msg, err error) {
	res := b.takePending(w)
	if res == nil {
		return
	}
	if err != nil {
		b.suspectGone(w.Subject, err)
		err = b.wrapErr(context.Background(), "publish", err)
	}
	res.Resolve(err)
	<-b.slots
}

// failPending resolves every PublishAsync result still waiting with
// sdk.ErrClosed. Close calls it once closed is set.
func (b *Broker) failPending() {
	b.pendMu.Lock()
	pend := b.pending
	b.pending = map[*nats.Msg]*sdk.PublishResult{}
	b.pendMu.Unlock()
	for _, res := range pend {
		res.Resolve(sdk.ErrClosed)
		<-b.slots
	}
}
