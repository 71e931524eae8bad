package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/sdk"
)

// maxBatch bounds one pull request.
const maxBatch = 256

// Receive returns up to max deliveries from queue (declared on first use),
// each leased for [Options.AckWait]. It first takes what is ready at once
// (a no_wait pull of max); when nothing is, it long-polls for one message for
// up to [Options.WaitTime] and then takes what else is ready, so it never
// waits for a batch to fill. It returns no deliveries and a nil error when
// the long poll ends empty.
//
// With [Options.NoDeclare], a queue whose consumer has a shorter AckWait
// than the Broker's is an [*AckWaitError].
//
// A message delivered more than [Options.MaxDeliveries] times is not
// returned: Receive moves it to the dead-letter stream with the cause
// [sdk.ErrMaxDeliveries]. A message whose berth headers do not decode is
// dead-lettered as permanent.
//
// When ctx ends (or Close is called) during the long poll, Receive returns at
// once; the pull request stays open on the server until it expires, and a
// message it still delivers is handed back without consuming an attempt (see
// the package doc). So is a message of a no_wait answer still arriving when
// ctx ends; those read before are returned. When Close is called during a
// Receive, Receive returns [sdk.ErrClosed] and hands back, likewise, every
// message it had read (it could not be settled on the closed Broker);
// Close waits for that.
func (b *Broker) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	if !b.enter() {
		return nil, sdk.ErrClosed
	}
	defer b.wg.Done()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	max = min(maxInt(max, 1), maxBatch)
	if err := b.connected("pull"); err != nil { // not held by a declaration while down
		return nil, err
	}
	q, err := b.queue(ctx, queue)
	if err != nil {
		return nil, err
	}
	if err := b.checkAckWait(ctx, q); err != nil {
		return nil, err
	}
	b.startMover(q)
	for {
		msgs, err := b.fetch(ctx, q, consumerName, max)
		if errors.Is(err, sdk.ErrClosed) || len(msgs) > 0 && b.closed.Load() {
			// Close began, also when the pull ended (its batch full)
			// without seeing it: the deliveries could not be settled.
			b.giveBackAll(q, consumerName, msgs)
			return nil, sdk.ErrClosed
		}
		if len(msgs) == 0 {
			return nil, err
		}
		ds := b.deliveries(ctx, q, msgs)
		if len(ds) > 0 && b.closed.Load() { // Close began while poison messages were moved
			b.giveBackAll(q, consumerName, slices.DeleteFunc(msgs, func(p pulled) bool {
				return !slices.ContainsFunc(ds, func(d sdk.Delivery) bool { return d.(*delivery).reply == p.msg.Reply })
			}))
			return nil, sdk.ErrClosed
		}
		if len(ds) > 0 || err != nil {
			return ds, nil
		}
		// Every message was poison and moved: look again.
	}
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// pulled is a message as pull read it, with when it arrived: a delivery's
// lease is counted from then, not from when Receive got round to it (after
// a follow-up pull, or after dead-lettering the poison messages before it),
// so that berth's lease never outlasts the server's AckWait.
type pulled struct {
	msg     *nats.Msg
	arrived time.Time
}

// fetch pulls up to max messages of consumer: what is ready now, else the
// first to come within WaitTime and what is ready after it. Messages come
// with a nil error or an error with the messages taken before it; with
// [sdk.ErrClosed] (Close during the pull), every message the pull read,
// which the caller gives back.
func (b *Broker) fetch(ctx context.Context, q *queueState, consumer string, max int) ([]pulled, error) {
	msgs, err := b.pull(ctx, q, consumer, max, 0)
	if len(msgs) > 0 || err != nil {
		return msgs, err
	}
	msgs, err = b.pull(ctx, q, consumer, 1, b.opts.WaitTime)
	if len(msgs) == 0 || err != nil || max == 1 {
		return msgs, err
	}
	more, err := b.pull(ctx, q, consumer, max-1, 0)
	return append(msgs, more...), err
}

// pullRequest is the body of a $JS.API.CONSUMER.MSG.NEXT request.
type pullRequest struct {
	Batch   int   `json:"batch"`
	Expires int64 `json:"expires,omitempty"`
	NoWait  bool  `json:"no_wait,omitempty"`
}

// pull sends one pull request for batch messages: no_wait when wait is 0,
// else open for wait. It reads the answers on a subscription of its own
// until the batch is full or the server ends the request. When ctx ends
// first (a long poll, or a no_wait answer on its way), the subscription is
// handed to a drain that gives back what the server still delivers. When
// the Broker closes first, it returns with [sdk.ErrClosed] the messages read
// and those the server sent it before it dropped the subscription (see
// unsubscribe).
func (b *Broker) pull(ctx context.Context, q *queueState, consumer string, batch int, wait time.Duration) ([]pulled, error) {
	if err := b.connected("pull"); err != nil {
		return nil, err
	}
	// A channel of its own, sized for the answer (batch messages and a
	// status): SubscribeSync would allocate nats.go's 64k-slot channel for
	// every pull.
	ch := make(chan *nats.Msg, batch+8)
	sub, err := b.nc.ChanSubscribe(b.nc.NewInbox(), ch)
	if err != nil {
		return nil, b.wrapErr(ctx, "subscribe", err)
	}
	if !b.track(sub) {
		_ = sub.Unsubscribe()
		return nil, sdk.ErrClosed
	}
	req := pullRequest{Batch: batch, NoWait: wait == 0}
	if wait > 0 {
		req.Expires = int64(wait)
	}
	body, _ := json.Marshal(req)
	subject := "$JS.API.CONSUMER.MSG.NEXT." + q.stream + "." + consumer
	if err := b.nc.PublishRequest(subject, sub.Subject, body); err != nil {
		b.untrack(sub)
		return nil, b.wrapErr(ctx, "pull", err)
	}
	// The server ends a waiting request at its expiry with a 408; a second
	// more covers a slow answer and a request lost in a reconnect.
	limit := time.Now().Add(wait + time.Second)
	if wait == 0 {
		// A no_wait answer takes a round trip. Bounded by WaitTime too: the
		// connection's Timeout may be long (an application's nats.Timeout),
		// and a request lost in a reconnect held Receive, and a Worker's
		// receive loop, for all of it.
		limit = time.Now().Add(min(b.nc.Opts.Timeout, b.opts.WaitTime) + time.Second)
	}
	timer := time.NewTimer(time.Until(limit))
	defer timer.Stop()
	var msgs []pulled
	for len(msgs) < batch {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-b.closing:
			rest := answered(ch, batch-len(msgs), wait, timer.C)
			if closePullHook != nil {
				closePullHook(b, consumer, func() int { return len(ch) })
			}
			// A long poll is still open at the server, and the answer
			// of a no_wait pull cut at expired may not be over: what
			// the server sends until it drops the subscription is
			// caught too.
			rest = append(rest, b.unsubscribe(sub, ch)...)
			return append(msgs, rest...), sdk.ErrClosed
		case <-ctx.Done():
			// A no_wait answer may be arriving too: the server has
			// counted a delivery of each message it sends.
			if !b.drain(q, consumer, sub, ch, limit) { // closed meanwhile
				return append(msgs, b.unsubscribe(sub, ch)...), sdk.ErrClosed
			}
			return msgs, ctx.Err()
		case <-timer.C:
			// No answer: the request was lost (a reconnect), the
			// consumer has no leader for the moment (its node died), or
			// the consumer is not there (deleted while no pull of this
			// Broker's waited on it to be told by a 409: a pull on a
			// missing consumer is never answered). The caller asks
			// again, and the next call on the queue looks its stream and
			// consumers up (recheck), declaring it again if one is
			// missing.
			b.untrack(sub)
			q.suspect.Store(true)
			return msgs, nil
		}
		if status := serverStatus(m); status != "" {
			switch status {
			case "100": // idle heartbeat
				continue
			case "404", "408": // no messages; request expired
				b.untrack(sub)
				return msgs, nil
			default: // 409: consumer deleted, too many waiting requests, ...
				b.untrack(sub)
				desc := m.Header.Get("Description")
				if status == "409" && strings.Contains(desc, "Deleted") {
					b.declared.Delete(q.name) // declared again on next use
					return msgs, &QueueDeletedError{Queue: q.name, Stream: q.stream, Status: status + " " + desc}
				}
				return msgs, fmt.Errorf("berth/jetstream: pull from %s: %w: status %s %s", q.stream, sdk.ErrUnavailable, status, desc)
			}
		}
		msgs = append(msgs, pulled{msg: m, arrived: time.Now()})
		if pullHook != nil {
			pullHook(b)
		}
	}
	b.untrack(sub)
	return msgs, nil
}

// pullHook, set by the tests, runs in pull after each message it reads.
var pullHook func(*Broker)

// closePullHook, set by the tests, runs in a pull that Close interrupts
// once it has read what its answer held, before it ends its subscription;
// held reports how many messages the subscription's channel holds.
var closePullHook func(b *Broker, consumer string, held func() int)

// serverStatus returns the status of m when it is the server's answer to a
// pull (404 no messages, 408 expired, 409 ..., 100 heartbeat), else "". A
// stored message may carry a Status header and no body too (any producer
// can write one): a delivered message always has its ack subject as reply,
// a status never has a reply.
func serverStatus(m *nats.Msg) string {
	if m.Reply != "" || len(m.Data) > 0 {
		return ""
	}
	return m.Header.Get("Status")
}

// QueueDeletedError reports that a queue's stream or consumer was deleted
// while a Receive waited on it. It wraps [sdk.ErrNotFound]; the next call
// declares the queue again.
type QueueDeletedError struct {
	Queue, Stream, Status string
}

func (e *QueueDeletedError) Error() string {
	return "berth/jetstream: queue " + e.Queue + " deleted while receiving (" + e.Stream + ": " + e.Status + ")"
}

// Unwrap returns [sdk.ErrNotFound].
func (e *QueueDeletedError) Unwrap() error { return sdk.ErrNotFound }

// answered returns the messages of a pull of a closing Broker still to
// come, up to n: of a no_wait pull, the rest of its answer (it is on its
// way, each message a delivery the server counted), until the server ends
// it or expired fires; of a long poll, which could wait for its expiry,
// only what ch holds (unsubscribe then catches what is still on its way).
func answered(ch <-chan *nats.Msg, n int, wait time.Duration, expired <-chan time.Time) []pulled {
	if wait > 0 {
		return buffered(ch)
	}
	var out []pulled
	for len(out) < n {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-expired:
			return out
		}
		switch serverStatus(m) {
		case "":
			out = append(out, pulled{msg: m, arrived: time.Now()})
		case "100":
		default: // the end of the answer
			return out
		}
	}
	return out
}

// buffered returns, without waiting, the messages of a pull's subscription
// that ch holds (the server's status answers left out).
func buffered(ch <-chan *nats.Msg) []pulled {
	var out []pulled
	for {
		select {
		case m := <-ch:
			if serverStatus(m) == "" {
				out = append(out, pulled{msg: m, arrived: time.Now()})
			}
		default:
			return out
		}
	}
}

// drain keeps reading a cancelled pull's subscription until the request
// expires (limit) or the Broker closes, and gives back every message the
// server still delivers to it (at Close, those it delivered before it
// dropped the subscription: see unsubscribe). It returns false, leaving
// the subscription to the caller, when the Broker is closed already: the
// caller ends it with unsubscribe and gives back what that returns.
func (b *Broker) drain(q *queueState, consumer string, sub *nats.Subscription, ch <-chan *nats.Msg, limit time.Time) bool {
	return b.goOwned(func() {
		timer := time.NewTimer(time.Until(limit))
		defer timer.Stop()
		for {
			var m *nats.Msg
			select {
			case m = <-ch:
			case <-timer.C:
				b.untrack(sub)
				return
			case <-b.closing:
				b.giveBackAll(q, consumer, b.unsubscribe(sub, ch))
				return
			}
			if status := serverStatus(m); status != "" {
				if status != "100" {
					b.untrack(sub)
					return
				}
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
			b.giveBack(ctx, q, consumer, m)
			cancel()
		}
	})
}

// unsubscribeTimeout bounds unsubscribe's wait for the server.
const unsubscribeTimeout = 2 * time.Second

// unsubscribe ends the subscription of a pull whose request may still be
// open at the server (a long poll, a no_wait answer not over) and returns
// the messages it holds and those the server sent it before dropping it,
// server statuses left out: each is a delivery the server counted, which
// the caller gives back. Unsubscribe would drop a message still on its way
// (nats.go discards what arrives for a subscription it has removed), and
// the message would come back only after its AckWait, an attempt spent.
// So the subscription is drained (nats.go's Drain): the UNSUB is sent,
// then a PING, and the subscription is removed once the PONG is back, when
// everything the server sent it before processing the UNSUB has been put
// in ch. It waits for that at most unsubscribeTimeout (then unsubscribes);
// with the connection down, it unsubscribes at once (nothing can arrive).
func (b *Broker) unsubscribe(sub *nats.Subscription, ch <-chan *nats.Msg) []pulled {
	b.mu.Lock()
	delete(b.subs, sub)
	b.mu.Unlock()
	if nats.Status(b.status.Load()) != nats.CONNECTED { // nothing more comes; a drain would wait for the reconnection
		_ = sub.Unsubscribe()
		return buffered(ch)
	}
	removed := sub.StatusChanged(nats.SubscriptionClosed) // closed once the drain removed sub
	if err := sub.Drain(); err != nil {                   // the connection closed meanwhile
		_ = sub.Unsubscribe()
		return buffered(ch)
	}
	timer := time.NewTimer(unsubscribeTimeout)
	defer timer.Stop()
	var out []pulled
	for {
		select {
		case m := <-ch:
			if serverStatus(m) == "" {
				out = append(out, pulled{msg: m, arrived: time.Now()})
			}
		case <-removed:
			return append(out, buffered(ch)...)
		case <-timer.C:
			_ = sub.Unsubscribe()
			return append(out, buffered(ch)...)
		}
	}
}

// giveBackTimeout bounds one give-back: of a message, or (giveBackAll) of
// the messages of one pull.
const giveBackTimeout = 10 * time.Second

// giveBackAll gives back msgs, within giveBackTimeout for all of them.
func (b *Broker) giveBackAll(q *queueState, consumer string, msgs []pulled) {
	if len(msgs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
	defer cancel()
	for _, p := range msgs {
		b.giveBack(ctx, q, consumer, p.msg)
	}
}

// giveBack returns a message that reached no caller without consuming an
// attempt: a delayed-subject message is simply nak'ed (its deliveries are
// not attempts); a ready one is stored again as a new copy whose first
// delivery counts as this delivery's attempt, then acknowledged. The copy
// is published past the Broker's publish path, which Close shuts first:
// the give-backs of a closing Broker run before Close closes the
// connection (their goroutines are the Broker's, or a Receive that Close
// waits for).
func (b *Broker) giveBack(ctx context.Context, q *queueState, consumer string, m *nats.Msg) {
	if consumer == delayConsumerName {
		_ = b.nc.Publish(m.Reply, ackNak)
		return
	}
	meta, err := m.Metadata()
	if err != nil {
		return
	}
	dec, err := decode(m.Header, m.Data, q.stream, meta.Sequence.Stream, meta.Timestamp)
	if err != nil {
		_ = b.nc.Publish(m.Reply, ackNak)
		return
	}
	attempt := b.attemptOf(dec.base, meta.NumDelivered)
	id := internalID(idGiveBack, q.stream, meta.Sequence.Stream, meta.NumDelivered)
	w, err := encode(dec.msg, dec.extra, q.ready, attempt, time.Time{})
	if err == nil {
		err = b.connected("give back")
	}
	if err == nil {
		_, err = b.js.PublishMsg(ctx, w, jetstream.WithMsgID(id))
	}
	if err != nil {
		b.opts.Logger.Warn("berth/jetstream: giving back an unclaimed delivery; it comes back after its AckWait",
			"queue", q.name, "err", err)
		return
	}
	_ = b.nc.Publish(m.Reply, ackAck)
}

// Acknowledgement bodies of the JetStream protocol.
var (
	ackAck      = []byte("+ACK")
	ackNak      = []byte("-NAK")
	ackProgress = []byte("+WPI")
)

func nakDelay(d time.Duration) []byte {
	if d <= 0 {
		return ackNak
	}
	return []byte(`-NAK {"delay": ` + strconv.FormatInt(int64(d), 10) + `}`)
}

// deliveries turns pulled messages into Deliveries, moving poison and
// undecodable ones to the dead-letter stream instead.
func (b *Broker) deliveries(ctx context.Context, q *queueState, msgs []pulled) []sdk.Delivery {
	out := make([]sdk.Delivery, 0, len(msgs))
	for _, p := range msgs {
		m, arrived := p.msg, p.arrived
		meta, err := m.Metadata()
		if err != nil {
			b.opts.Logger.Error("berth/jetstream: message without JetStream metadata", "queue", q.name, "err", err)
			continue
		}
		d := &delivery{
			b: b, q: q, reply: m.Reply, seq: meta.Sequence.Stream, stored: meta.Timestamp, delivered: meta.NumDelivered,
			deadline: arrived.Add(b.leaseFor()),
		}
		dec, err := decode(m.Header, m.Data, q.stream, meta.Sequence.Stream, meta.Timestamp)
		if err != nil {
			// Its other headers are kept in the dead letter.
			dec = asForeign(m.Header, m.Data, seqID(q.stream, d.seq, d.stored))
			d.msg, d.extra = dec.msg, dec.extra
			d.attempt = b.attemptOf(1, meta.NumDelivered)
			if derr := d.DeadLetter(ctx, sdk.Permanent(err)); derr != nil {
				b.opts.Logger.Error("berth/jetstream: dead-lettering an undecodable message", "queue", q.name, "err", derr)
			}
			continue
		}
		d.msg, d.extra = dec.msg, dec.extra
		d.attempt = b.attemptOf(dec.base, meta.NumDelivered)
		if d.attempt > b.opts.MaxDeliveries {
			if derr := d.deadLetter(ctx, sdk.ErrMaxDeliveries, d.attempt-1); derr != nil {
				b.opts.Logger.Error("berth/jetstream: dead-lettering a poison message", "queue", q.name, sdk.LogText("id", d.msg.ID), "err", derr)
			}
			continue
		}
		out = append(out, d)
	}
	return out
}

// attemptOf returns the attempt of a delivery: the copy's carried-over
// attempt (base) plus the deliveries of this copy before it. base is
// bounded by the poison cap plus one: a carried attempt is one berth handed
// out (Release), hence at most the cap, or that of a delivery no caller
// received (a give-back), which is past the cap for a poison message and
// must stay past it, so that the copy is dead-lettered rather than
// delivered once more. It never overflows.
func (b *Broker) attemptOf(base int, numDelivered uint64) int {
	base = max(base, 1)
	if base > b.opts.MaxDeliveries {
		base = b.opts.MaxDeliveries + 1
	}
	n := int(min(max(numDelivered, 1), maxCarried))
	return base + n - 1
}

// leaseFor is how long berth counts a lease from a message's arrival: the
// AckWait less a margin for the time the message took to arrive, so that
// berth never settles a delivery the server may already have redelivered.
func (b *Broker) leaseFor() time.Duration {
	return b.opts.AckWait - min(b.opts.AckWait/20, 250*time.Millisecond)
}
