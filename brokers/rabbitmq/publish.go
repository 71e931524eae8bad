package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// UnroutableError reports a message the server returned because no queue
// took it (the mandatory flag): usually the queue does not exist. It wraps
// [sdk.ErrNotFound].
type UnroutableError struct {
	Exchange   string
	RoutingKey string
	Code       uint16
	Reason     string
}

func (e *UnroutableError) Error() string {
	return fmt.Sprintf("rabbitmq: message returned unroutable by exchange %q, routing key %q: %d %s",
		e.Exchange, e.RoutingKey, e.Code, e.Reason)
}

// Unwrap returns [sdk.ErrNotFound].
func (e *UnroutableError) Unwrap() error { return sdk.ErrNotFound }

// DelayError reports a Publish delay longer than the largest delay bucket
// ([Options.DelayBuckets]): the message would be delivered early, after that
// bucket. Nothing of the batch was published. It wraps
// [sdk.ErrInvalidMessage].
type DelayError struct {
	ID    string        // message ID
	Delay time.Duration // the delay asked
	Max   time.Duration // the largest delay bucket
}

func (e *DelayError) Error() string {
	return fmt.Sprintf("rabbitmq: message %s: delay %s beyond the largest delay bucket, %s", sdk.ErrorText(e.ID), e.Delay, e.Max)
}

// Unwrap returns [sdk.ErrInvalidMessage].
func (e *DelayError) Unwrap() error { return sdk.ErrInvalidMessage }

// errNacked is the cause when the server refuses a message (basic.nack).
var errNacked = fmt.Errorf("%w: rabbitmq: message refused by the server (nack)", sdk.ErrUnavailable)

// pubChannel is a confirm-mode channel. One goroutine (confirmLoop) reads its
// returns and its confirms: amqp091 hands both over from its single reader
// goroutine, RabbitMQ sends a basic.return before the basic.ack of the same
// message, and the returns channel is unbuffered, so a return is always
// recorded before the confirm it belongs to is resolved.
//
// A basic.return carries no delivery tag, so a return is recorded under the
// message ID, exchange and routing key it came back with, and a confirm
// takes only a return recorded under its own publish's three. The message ID
// alone is not enough: the same message published to two queues (as the
// outbox relay may) has one ID, and the confirm of the copy that was routed
// would take the return of the one that was not, failing the first and
// reporting the dropped one confirmed.
type pubChannel struct {
	ch *amqp.Channel

	pubMu sync.Mutex // serialises publishes so delivery tags are known

	mu       sync.Mutex
	pending  map[uint64]*pending
	returned map[returnKey][]amqp.Return // until their confirms, oldest first
	dead     error                       // set when the channel closed
	gone     atomic.Bool                 // dead != nil, readable without mu

	maxHeader int // the largest content header frame payload of its connection (0: no limit)
}

// returnKey identifies the publish a basic.return belongs to.
type returnKey struct {
	id, exchange, key string
}

type pending struct {
	id       string
	exchange string     // the exchange published to, to match a return
	done     chan error // buffered 1; nil for an asynchronous publish
	res      *sdk.PublishResult
	win      chan struct{} // the window token an asynchronous publish holds
	key      string        // routing key, to match a return and to forget an unroutable queue
}

// resolve hands the confirm's outcome to the waiting Publish or resolves
// the asynchronous result and frees its window slot.
func (p *pending) resolve(err error) {
	if p.res == nil {
		p.done <- err
		return
	}
	if p.res.Resolve(err) {
		<-p.win
	}
}

// The confirm channels, by what they publish to (see publisher).
const (
	pubDefault  = iota // the default exchange: queues and delay queues
	pubExchange        // a named exchange: dead letters, to the dead-letter exchange
	pubKinds
)

// chanOpen is the opening of one kind's confirm channel (see publisher):
// done is closed once pc or err is set.
type chanOpen struct {
	conn *amqp.Connection // the connection it opens on
	done chan struct{}
	pc   *pubChannel
	err  error
}

// publisher returns the live confirm channel for publishes to exchange,
// opening one when needed. Publishes to the default exchange, which always
// exists, share one channel; those to a named exchange (dead letters, to
// Options.DeadLetterExchange) have another: the server answers a publish to
// a missing exchange by closing its channel (404), which fails every
// publish awaiting its confirm there, and a dead-letter exchange deleted
// behind the broker's back must not fail the unrelated publishes of the
// shared channel (told ErrNotFound, as if their queue did not exist).
//
// Opening a channel takes server round trips, which amqp091 does not bound
// by a context: on a stalled connection they last until the heartbeat
// gives the connection up or Close closes it. So the channel is opened by a
// goroutine of the broker (openPublisher), one per kind at a time, and
// every caller that needs it, the one that started it included, waits for
// it or for its own ctx, whichever comes first: a caller whose ctx ends
// returns at once, an error wrapping [sdk.ErrUnavailable] and ctx.Err(),
// and the opening goes on for the next caller.
func (b *Broker) publisher(ctx context.Context, exchange string) (*pubChannel, error) {
	kind := pubDefault
	if exchange != "" {
		kind = pubExchange
	}
	// The fast path takes no lock: hundreds of concurrent Publish calls
	// queue on pubMu already, and did on b.mu and pc.mu as well.
	if pc := b.pcCur[kind].Load(); pc != nil && pc.alive() {
		return pc, nil
	}
	conn, err := b.pub.get(ctx)
	if err != nil {
		return nil, err
	}
	for {
		// Under mu: Close closes done under mu and then waits for wg, so
		// no opener starts after its Wait.
		b.mu.Lock()
		if b.stopped() { // not closed(): Close publishes the copies of handed-back deliveries
			b.mu.Unlock()
			return nil, sdk.ErrClosed
		}
		if pc := b.pcCur[kind].Load(); pc != nil && pc.alive() {
			b.mu.Unlock()
			return pc, nil
		}
		op := b.pcOpening[kind]
		if op == nil {
			op = &chanOpen{conn: conn, done: make(chan struct{})}
			b.pcOpening[kind] = op
			b.wg.Add(1)
			go b.openPublisher(kind, op)
		}
		b.mu.Unlock()
		select {
		case <-op.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: rabbitmq: waiting for the publish channel to open: %w", sdk.ErrUnavailable, ctx.Err())
		}
		if op.err == nil || op.conn == conn || errors.Is(op.err, sdk.ErrClosed) {
			return op.pc, op.err
		}
		// The opening joined was on an earlier connection, lost since:
		// open one on the connection this call has.
	}
}

// openPublisher opens a confirm channel of kind on op.conn, makes it the
// current one and hands the outcome to op's waiters. It is bounded by the
// connection: a lost connection (the heartbeat gives a stalled one up)
// fails the opening, and so does Close, which closes the connection under
// it: the callers were cut by Close, ErrClosed.
//
// It holds no lock across the round trips, b.mu least of all: their
// replies come from the connection's reader goroutine, which also delivers
// every basic.return of the channels already open, to a confirmLoop that
// may be waiting for b.mu (forget). Holding b.mu stalled that loop and,
// through it, the reader: amqp091 drops a notification it cannot hand over
// within 5 s, and a dropped return left its message's confirm (an ack) to
// report a message no queue took as published.
func (b *Broker) openPublisher(kind int, op *chanOpen) {
	defer b.wg.Done()
	pc, confirms, returns, closed, err := openConfirmChannel(op.conn)
	b.mu.Lock()
	switch {
	case err != nil && b.stopped():
		err = sdk.ErrClosed
	case err == nil && b.stopped():
		_ = pc.ch.Close()
		pc, err = nil, sdk.ErrClosed
	case err == nil:
		// Under mu: Close closes done under mu and then waits for wg, so
		// no confirmLoop starts after its Wait.
		b.wg.Add(1)
		go pc.confirmLoop(b, confirms, returns, closed)
		b.pcCur[kind].Store(pc)
	}
	b.pcOpening[kind] = nil
	b.mu.Unlock()
	op.pc, op.err = pc, err
	close(op.done)
}

// openConfirmChannel opens a channel on conn in confirm mode and returns
// it with its notification channels, for confirmLoop.
func openConfirmChannel(conn *amqp.Connection) (*pubChannel, chan amqp.Confirmation, chan amqp.Return, chan *amqp.Error, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%w: rabbitmq: open publish channel: %w", sdk.ErrUnavailable, err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, nil, nil, nil, fmt.Errorf("%w: rabbitmq: confirm mode: %w", sdk.ErrUnavailable, err)
	}
	pc := &pubChannel{ch: ch, pending: make(map[uint64]*pending), returned: make(map[returnKey][]amqp.Return)}
	if fm := conn.Config.FrameSize; fm > 0 {
		pc.maxHeader = fm - frameOverhead
	}
	// Returns unbuffered, confirms buffered: the reader goroutine blocks
	// until confirmLoop has taken a return, and confirmLoop records it before
	// it reads anything else, so the confirm of a returned message, which
	// the server sends after the return, always finds it recorded. That
	// holds only while confirmLoop never waits long (amqp091 gives up a send
	// after 5 s): it takes no lock held across a round trip.
	confirms := make(chan amqp.Confirmation, 1024)
	returns := make(chan amqp.Return)
	closed := make(chan *amqp.Error, 1) // amqp091 sends it before closing confirms
	ch.NotifyPublish(confirms)
	ch.NotifyReturn(returns)
	ch.NotifyClose(closed)
	return pc, confirms, returns, closed, nil
}

func (pc *pubChannel) alive() bool {
	return !pc.gone.Load() && !pc.ch.IsClosed()
}

func (pc *pubChannel) confirmLoop(b *Broker, confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closed <-chan *amqp.Error) {
	defer b.wg.Done()
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			k := returnKey{id: r.MessageId, exchange: r.Exchange, key: r.RoutingKey}
			pc.mu.Lock()
			pc.returned[k] = append(pc.returned[k], r)
			pc.mu.Unlock()
		case c, ok := <-confirms:
			if !ok {
				pc.fail(closeCause(closed))
				return
			}
			pc.mu.Lock()
			p := pc.pending[c.DeliveryTag]
			delete(pc.pending, c.DeliveryTag)
			var err error
			if p != nil {
				k := returnKey{id: p.id, exchange: p.exchange, key: p.key}
				if rs := pc.returned[k]; len(rs) > 0 {
					r := rs[0]
					if len(rs) == 1 {
						delete(pc.returned, k)
					} else {
						pc.returned[k] = rs[1:]
					}
					err = &UnroutableError{Exchange: r.Exchange, RoutingKey: r.RoutingKey, Code: r.ReplyCode, Reason: r.ReplyText}
				} else if !c.Ack {
					err = errNacked
				}
			}
			pc.mu.Unlock()
			if p != nil {
				if p.res != nil && err != nil && errors.As(err, new(*UnroutableError)) {
					b.forget(p.key) // declare it again on the next publish
				}
				p.resolve(err)
			}
		case <-b.done:
			_ = pc.ch.Close()
			pc.fail(sdk.ErrClosed)
			return
		}
	}
}

// closeCause says why the publish channel closed: a missing exchange (the
// server closes the channel with 404) wraps [sdk.ErrNotFound]; a publish the
// login may not make (403 ACCESS_REFUSED: no write permission on the
// exchange) wraps the server's *amqp.Error and not [sdk.ErrUnavailable], as
// a refused consume and a refused login do: the server is up and answered,
// and a retry is refused the same way until the login's permissions change
// (see [refused]); anything else, a lost connection first of all, wraps
// [sdk.ErrUnavailable].
func closeCause(closed <-chan *amqp.Error) error {
	select {
	case e := <-closed:
		if e != nil && e.Code == amqp.NotFound {
			return fmt.Errorf("%w: rabbitmq: publish channel closed by the server: %w", sdk.ErrNotFound, e)
		}
		if e != nil && e.Code == amqp.AccessRefused {
			return fmt.Errorf("rabbitmq: publish refused by the server (check the login's write permission on the exchange; "+
				"the default exchange is amq.default to permissions): %w", e)
		}
		if e != nil {
			return fmt.Errorf("%w: rabbitmq: publish channel closed before the confirm: %w", sdk.ErrUnavailable, e)
		}
	default:
	}
	return fmt.Errorf("%w: rabbitmq: publish channel closed before the confirm", sdk.ErrUnavailable)
}

// fail resolves every pending publish with err and marks the channel dead.
func (pc *pubChannel) fail(err error) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.dead == nil {
		pc.dead = err
		pc.gone.Store(true)
	}
	for tag, p := range pc.pending {
		p.resolve(err)
		delete(pc.pending, tag)
	}
}

// send publishes one message and returns the pending confirm.
func (pc *pubChannel) send(ctx context.Context, exchange, key, id string, p amqp.Publishing) (*pending, error) {
	pd := &pending{id: id, exchange: exchange, key: key, done: make(chan error, 1)}
	if err := pc.write(ctx, exchange, key, pd, p); err != nil {
		return nil, err
	}
	return pd, nil
}

// write registers pd under the next delivery tag and publishes p.
func (pc *pubChannel) write(ctx context.Context, exchange, key string, pd *pending, p amqp.Publishing) error {
	// A content header frame over frame_max is a connection error: the
	// server would close the connection under every publish, settlement
	// copy and declaration on it, and a retry would do it again. Publish
	// refuses such a message up front (checkFrame); this catches the copies
	// berth makes (a dead letter's annotations, a walk's stamp).
	if pc.maxHeader > 0 {
		if n := contentHeaderSize(p); n > pc.maxHeader {
			return fmt.Errorf("rabbitmq: message %s: its properties and headers take %d bytes, over the %d one content header frame holds on this connection: %w",
				sdk.ErrorText(pd.id), n, pc.maxHeader, &sdk.MessageTooLargeError{ID: pd.id, Size: n, Limit: pc.maxHeader})
		}
	}
	pc.pubMu.Lock()
	defer pc.pubMu.Unlock()
	tag := pc.ch.GetNextPublishSeqNo()
	pc.mu.Lock()
	if pc.dead != nil {
		err := pc.dead
		pc.mu.Unlock()
		return err
	}
	pc.pending[tag] = pd
	pc.mu.Unlock()
	if err := pc.ch.PublishWithContext(ctx, exchange, key, true, false, p); err != nil {
		pc.mu.Lock()
		delete(pc.pending, tag)
		dead := pc.dead
		pc.mu.Unlock()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if refused(dead) {
			// The server closed the channel refusing an earlier publish
			// to the same exchange: this one would be refused too.
			return dead
		}
		return fmt.Errorf("%w: rabbitmq: publish: %w", sdk.ErrUnavailable, err)
	}
	return nil
}

// refused reports whether err is the server's refusal of a publish the
// login may not make (403 ACCESS_REFUSED, see closeCause).
func refused(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.AccessRefused
}

// outgoing is one message ready for the wire.
type outgoing struct {
	id       string
	exchange string
	key      string
	pub      amqp.Publishing
}

// sendAll publishes out pipelined (see sendEach). It returns nil or a
// *sdk.PublishError naming the failed messages by ID: for Publish, whose
// messages sdk.Prepare gave IDs. Copies of delivered messages, whose IDs
// may repeat, go through sendEach.
func (b *Broker) sendAll(ctx context.Context, out []outgoing) error {
	failed, err := b.sendEach(ctx, out)
	if err != nil {
		return failAll(out, err)
	}
	if failed == nil {
		return nil
	}
	byID := make(map[string]error)
	for i, ferr := range failed {
		if ferr != nil {
			byID[out[i].id] = ferr
		}
	}
	return &sdk.PublishError{Failed: byID}
}

// sendEach publishes out pipelined: every message is written, then every
// confirm awaited. It returns nil, nil when the server confirmed every
// message; else failed holds the cause of each failure by position
// (failed[i] is out[i]'s, nil when confirmed), or err says that no channel
// could be had and nothing was sent. Messages are told apart by position,
// never by ID: the copies berth makes of delivered messages (Close's and a
// pause's hand-back, a delay queue's mover, a dead-letter walk) carry the
// IDs their producers gave, which may repeat — a producer outside berth
// often sets none, so that many share the empty ID — and one message's
// outcome must not be taken for another's.
func (b *Broker) sendEach(ctx context.Context, out []outgoing) (failed []error, err error) {
	exchange := ""
	for _, o := range out {
		if o.exchange != "" {
			exchange = o.exchange
		}
	}
	pc, err := b.publisher(ctx, exchange)
	if err != nil {
		return nil, err
	}
	fail := func(i int, err error) {
		if failed == nil { // allocated on the first failure
			failed = make([]error, len(out))
		}
		failed[i] = err
	}
	var one [1]*pending // a single message, the common case, allocates no slice
	waits := one[:]
	if len(out) > 1 {
		waits = make([]*pending, len(out))
	}
	for i, o := range out {
		pd, err := pc.send(ctx, o.exchange, o.key, o.id, o.pub)
		if err != nil {
			fail(i, err)
			continue
		}
		waits[i] = pd
	}
	for i, pd := range waits {
		if pd == nil {
			continue
		}
		select {
		case err := <-pd.done:
			if err != nil {
				fail(i, err)
			}
		case <-ctx.Done():
			fail(i, fmt.Errorf("%w: rabbitmq: waiting for the confirm: %w", sdk.ErrUnavailable, ctx.Err()))
		}
	}
	if failed != nil && b.stopped() {
		// Close cut the channel under these messages: a retry would get
		// ErrClosed, so they say ErrClosed rather than ErrUnavailable.
		for i, err := range failed {
			if err != nil && !errors.Is(err, sdk.ErrClosed) {
				failed[i] = fmt.Errorf("%w: rabbitmq: closed during the publish (%v)", sdk.ErrClosed, err)
			}
		}
	}
	return failed, nil
}

func failAll(out []outgoing, err error) error {
	if errors.Is(err, sdk.ErrClosed) {
		return sdk.ErrClosed
	}
	failed := make(map[string]error, len(out))
	for _, o := range out {
		failed[o.id] = err
	}
	return &sdk.PublishError{Failed: failed}
}

// checkFrame refuses, before anything is published, a message whose
// properties and headers do not fit in one content header frame of the
// publishing connection (AMQP cannot split one; the server's frame_max,
// 128 KiB by default) with room for the headers berth adds to its copies
// (deadLetterRoom): sent, it would make the server close the whole
// connection (501 FRAME_ERROR), failing every publish and settlement on it,
// and a producer retrying the ErrUnavailable it got would do so again. The
// error wraps a *[sdk.MessageTooLargeError].
func (b *Broker) checkFrame(m *sdk.Message) error {
	fm := int(b.frameMax.Load())
	if fm <= 0 {
		return nil
	}
	limit := fm - frameOverhead - deadLetterRoom
	if n := messageHeaderSize(m); n > limit {
		return fmt.Errorf("rabbitmq: message %s: its properties and headers take %d bytes; one content header frame holds %d "+
			"with room for the dead-letter headers (frame_max %d): %w", sdk.ErrorText(m.ID), n, limit, fm,
			&sdk.MessageTooLargeError{ID: m.ID, Size: n, Limit: limit})
	}
	return nil
}

// Publish sends msgs to queue with publisher confirms, pipelined, and
// returns once the server has confirmed every one of them. Messages with a
// Delay go through the delay queue of the next bucket up (see the package
// doc). Validation errors publish nothing (a Delay beyond the largest delay
// bucket is one: [*DelayError]; properties and headers that do not fit in
// one frame of the connection, with room for the dead-letter headers, are
// another: an error wrapping [*sdk.MessageTooLargeError]); a failure at the broker returns a
// *[sdk.PublishError] whose causes wrap [sdk.ErrUnavailable] (connection or
// channel lost, or the server refused the message with basic.nack: retry),
// [sdk.ErrNotFound] ([*UnroutableError]: no such queue, with NoDeclare) or,
// when the login may not publish to the exchange, the server's
// *amqp.Error 403 (ACCESS_REFUSED) without [sdk.ErrUnavailable]: a retry is
// refused the same way until the login's permissions change, as with a
// refused consume or login; nothing of the call reached the queue unless
// the server let earlier messages of the channel through. During an
// outage Publish waits for the reconnection, bounded by ctx and
// [Options.UnavailableAfter]. After Close it returns [sdk.ErrClosed].
func (b *Broker) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	if b.closed() {
		return sdk.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err // sdk.Publisher: nothing published, ctx.Err() itself
	}
	if err := sdk.PrepareAll(ctx, queue, msgs, b.opts.MaxMessageSize); err != nil {
		return err
	}
	longest := b.opts.DelayBuckets[len(b.opts.DelayBuckets)-1]
	for _, m := range msgs {
		if err := validate(m); err != nil {
			return err
		}
		if err := b.checkFrame(m); err != nil {
			return err
		}
		if m.Delay > longest {
			return &DelayError{ID: m.ID, Delay: m.Delay, Max: longest}
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	if err := b.ensure(ctx, queue); err != nil {
		return err
	}
	now := time.Now()
	out := make([]outgoing, 0, len(msgs))
	for _, m := range msgs {
		key := queue
		if m.Delay > 0 {
			bq, err := b.ensureDelay(ctx, queue, m.Delay)
			if err != nil {
				return err
			}
			key = bq
		}
		out = append(out, outgoing{id: m.ID, key: key, pub: encode(m, 1, now)})
	}
	err := b.sendAll(ctx, out)
	var ue *UnroutableError
	if errors.As(err, &ue) {
		// The queue was deleted behind our back (or never declared, with
		// NoDeclare): declare it again on the next Publish.
		b.forget(ue.RoutingKey)
	}
	return err
}

// PublishAsync publishes msg with a publisher confirm and returns at once:
// the result resolves when the server confirms the message (nil), refuses
// it, returns it unroutable ([*UnroutableError]) or the channel is lost
// (an error wrapping [sdk.ErrUnavailable]; [sdk.ErrClosed] after Close). A
// publish the login may not make fails, as with Publish, with the server's
// *amqp.Error 403 (ACCESS_REFUSED), not [sdk.ErrUnavailable].
// At most [Options.MaxInFlight] messages wait for their confirm, a
// sliding window shared by every caller: beyond it PublishAsync blocks
// until a confirm frees a slot or ctx ends (ctx.Err(), nothing published).
// Validation errors are returned at once, nothing published, as with
// Publish. Messages of one caller reach the queue in call order.
//
// It adds no latency of its own: the message is written to the socket
// before PublishAsync returns, and its result resolves when the confirm
// arrives (RabbitMQ confirms a persistent message once it is written to
// disk, or replicated on a quorum queue: typically 1–10 ms here).
func (b *Broker) PublishAsync(ctx context.Context, queue string, msg *sdk.Message) (*sdk.PublishResult, error) {
	if b.closed() {
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
	if err := b.checkFrame(msg); err != nil {
		return nil, err
	}
	if longest := b.opts.DelayBuckets[len(b.opts.DelayBuckets)-1]; msg.Delay > longest {
		return nil, &DelayError{ID: msg.ID, Delay: msg.Delay, Max: longest}
	}
	if err := b.ensure(ctx, queue); err != nil {
		return nil, err
	}
	key := queue
	if msg.Delay > 0 {
		bq, err := b.ensureDelay(ctx, queue, msg.Delay)
		if err != nil {
			return nil, err
		}
		key = bq
	}
	select {
	case b.window <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.closing:
		return nil, sdk.ErrClosed
	}
	pc, err := b.publisher(ctx, "")
	if err != nil {
		<-b.window
		return nil, err
	}
	pd := &pending{id: msg.ID, res: sdk.NewPublishResult(msg.ID), win: b.window, key: key}
	if err := pc.write(ctx, "", key, pd, encode(msg, 1, time.Now())); err != nil {
		if pd.res.Resolve(err) { // not already failed by a dying channel
			<-b.window
		}
		if b.stopped() && !errors.Is(err, sdk.ErrClosed) {
			err = fmt.Errorf("%w: rabbitmq: closed during the publish (%v)", sdk.ErrClosed, err)
		}
		return nil, err
	}
	return pd.res, nil
}
