package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// consumer consumes one queue on its own channel of the consuming
// connection and feeds the deliveries to Receive through out. It reopens
// the channel (and redeclares) when the channel or the connection dies.
type consumer struct {
	b     *Broker
	queue string
	out   chan *delivery // buffered to Prefetch

	prefetch int                       // basic.qos of its channels
	cur      atomic.Pointer[chanState] // the channel consuming now, for Flush

	// recv is read-held by each Receive from before it takes deliveries
	// from out until it has decided to return them, and write-held by
	// handBack while it collects what no Receive returned: a Receive that
	// finds Close begun puts what it took in back (under backMu) rather
	// than return deliveries its caller could no longer settle, and
	// handBack hands them back with the others.
	recv   sync.RWMutex
	backMu sync.Mutex
	back   []*delivery

	gone   chan struct{} // closed when the consumer stopped for good (err says why)
	err    error         // set before gone is closed
	exited chan struct{} // closed when run returns

	// A pause (Broker.StopReceiving): the session cancels its basic.consume,
	// hands back what no Receive returned and consumes again once a Receive
	// resumes it; the channel, and with it the deliveries Receive returned,
	// stays open. Under pmu.
	pmu      sync.Mutex
	paused   bool
	pausing  chan struct{} // closed when a pause begins (a waiting Receive resumes); replaced at resume
	resumed  chan struct{} // closed at resume; made by pause
	handed   chan struct{} // closed once the pause's hand-back is done, or at resume; made by pause
	pauseReq chan struct{} // buffered 1: tells the session a pause began
}

// pause marks c paused and tells its session, and returns a channel closed
// once the session has handed back what it held (or at resume).
func (c *consumer) pause() <-chan struct{} {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if !c.paused {
		c.paused = true
		c.resumed, c.handed = make(chan struct{}), make(chan struct{})
		close(c.pausing)
		select {
		case c.pauseReq <- struct{}{}:
		default: // one is pending: the session reads the state when it takes it
		}
		if st := c.cur.Load(); st == nil || st.isDead() {
			// No channel open (not yet, or lost: the server requeued what
			// it held): nothing to hand back. A session that opens one
			// stored it in cur before it reads the pause state (under
			// pmu), so it finds the pause and consumes nothing.
			close(c.handed)
		}
	}
	return c.handed
}

// resume ends a pause for a Receive under ctx: the session consumes again.
// It returns the channel the next pause closes. A ctx already done resumes
// nothing: a Worker's Pause cancels its Receive's ctx before it pauses the
// consumer, so checked under pmu this tells a Receive that the pause
// interrupted from one that came after it.
func (c *consumer) resume(ctx context.Context) <-chan struct{} {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.paused && ctx.Err() == nil {
		c.paused = false
		c.pausing = make(chan struct{})
		close(c.resumed)
		closeOnce(c.handed)
	}
	return c.pausing
}

// pauseState returns whether c is paused and, if so, the pause's resumed
// and handed channels.
func (c *consumer) pauseState() (paused bool, resumed, handed chan struct{}) {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return c.paused, c.resumed, c.handed
}

// markHanded closes handed (a pause's) unless it is closed already.
func (c *consumer) markHanded(handed chan struct{}) {
	c.pmu.Lock()
	closeOnce(handed)
	c.pmu.Unlock()
}

// closeOnce closes ch unless it is nil or closed; its callers hold pmu.
func closeOnce(ch chan struct{}) {
	if ch == nil {
		return
	}
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// chanState is one consumer channel's life: deliveries hold it, and a
// settlement on a dead one reports [sdk.ErrLeaseLost]. It also coalesces
// the channel's acks (see the package doc, "Acknowledgements"): an Ack
// records its delivery tag as acked, and a flush sends one basic.ack with
// the multiple flag for every acked tag below the lowest tag still
// unsettled, and single acks for acked tags that waited above an
// unsettled one for a whole flush. A multiple ack therefore never covers a
// delivery whose holder has not acked it, and never leaves its channel.
type chanState struct {
	ch   *amqp.Channel
	dead chan struct{}
	once sync.Once

	interval time.Duration // Options.AckInterval; 0 with SyncAck: every ack is flushed at once
	flushAt  int           // acked tags that trigger a flush without waiting for the interval
	crowdAt  int           // held acks that go out alone without waiting for the interval
	// written, with SyncAck, waits until the frames amqp091 has handed to
	// the connection are written to the socket (batchConn.sync): a flush
	// returns only then. Nil otherwise.
	written func() error
	// processed, with SyncAck, makes a synchronous round trip on the
	// channel (basic.qos with the channel's prefetch, which changes
	// nothing for its consumer): the server handles a channel's methods in
	// order, so once qos-ok is back, every ack written before it has been
	// processed. A frame only written to the socket can still be lost by a
	// process that dies: SIGKILL with unread data in its receive queue
	// resets the connection, which discards what the server had not read
	// yet, and the server may shut the channel down before it handles an
	// ack it has read. Nil otherwise.
	processed func() error
	// unsure is set, under flushMu, when a round trip failed: the acks of
	// that flush may or may not have been processed, and a later flush
	// that sent nothing (its caller's ack went out with that one) says so.
	unsure bool

	mu      sync.Mutex
	unacked map[uint64]struct{} // tags handed out and not settled (nor being settled) on the wire
	low     uint64              // no tag below low is in unacked
	last    uint64              // highest tag handed out
	acked   []uint64            // acked by their holders since the last flush, not sent
	held    []uint64            // acked, left by a flush above an unsettled tag, not sent; oldest first
	oldHeld int                 // the first oldHeld of held were held at the last tick already
	timer   *time.Timer         // flushes interval after the first unsent ack
	armed   bool                // timer set and not yet fired
	lost    int                 // acks dropped unsent because the channel died

	flushMu sync.Mutex // one flush at a time: what a flush sends and the order it reaches the wire

	// rpcMu serialises the synchronous calls made on the channel while it
	// consumes: processed's basic.qos (from the Acks' flushes), and the
	// basic.consume and basic.cancel of a pause and its resume. amqp091
	// hands a reply to whichever call reads it first, so two in flight at
	// once could take each other's replies: an Ack failed with
	// ErrLeaseLost although its frame went out, or a resume's
	// basic.consume failed and the channel was closed under every
	// delivery in flight.
	//
	// The channel's close (channel.close, answered by close-ok) is such a
	// call too, and is made under rpcMu ([chanState.close]): amqp091
	// routes close-ok to the waiting calls like any reply, so a close in
	// flight with a basic.qos could take the qos-ok (the Ack failed
	// although the server processed it), or, sent before the basic.qos
	// (which the server's closing channel then drops), leave its close-ok
	// to the Qos and wait for a reply that never comes, until the
	// connection dies.
	rpcMu sync.Mutex

	hook func(tag uint64, multiple bool) // tests: sees every ack frame before it is sent
}

// newChanState returns the state of consumer channel ch of the connection
// whose socket writer is w (nil in unit tests: SyncAck then waits for
// amqp091's write only).
func newChanState(ch *amqp.Channel, w *batchConn, o Options, prefetch int, hook func(uint64, bool)) *chanState {
	st := &chanState{ch: ch, dead: make(chan struct{}), unacked: make(map[uint64]struct{}, prefetch), low: 1, flushAt: 1, crowdAt: 1, hook: hook}
	if o.SyncAck && w != nil {
		st.written = w.sync
		st.processed = func() error {
			st.rpcMu.Lock()
			defer st.rpcMu.Unlock()
			return ch.Qos(prefetch, 0, false)
		}
	}
	if !o.SyncAck {
		st.interval = o.AckInterval
		st.flushAt = max(1, prefetch/4)
		st.crowdAt = max(st.flushAt, prefetch*3/4)
	}
	return st
}

// track records a delivery tag as handed out and unsettled.
func (s *chanState) track(tag uint64) {
	s.mu.Lock()
	s.unacked[tag] = struct{}{}
	s.last = max(s.last, tag)
	s.mu.Unlock()
}

// untrack records tags as settled on the wire (their frames were sent).
func (s *chanState) untrack(tags ...uint64) {
	s.mu.Lock()
	for _, t := range tags {
		delete(s.unacked, t)
	}
	s.advance()
	s.mu.Unlock()
}

// advance moves low past the tags no longer unsettled; under mu. Each tag
// is passed once, so it costs one map lookup per delivery overall.
func (s *chanState) advance() {
	for s.low <= s.last {
		if _, ok := s.unacked[s.low]; ok {
			return
		}
		s.low++
	}
}

// ack records tag as acked by its holder; the ack is sent by the next
// flush: at once with SyncAck, else when flushAt acks wait or interval
// after the first. It returns the error of a flush it ran itself.
func (s *chanState) ack(tag uint64) error {
	s.mu.Lock()
	if s.isDead() {
		s.mu.Unlock()
		return errChannelGone
	}
	delete(s.unacked, tag)
	s.advance()
	s.acked = append(s.acked, tag)
	now := len(s.acked) >= s.flushAt
	if !now && !s.armed {
		s.arm()
	}
	s.mu.Unlock()
	if now {
		return s.flush(s.interval == 0, false)
	}
	return nil
}

// arm sets the timer to flush after interval; under mu.
func (s *chanState) arm() {
	s.armed = true
	if s.timer == nil {
		s.timer = time.AfterFunc(s.interval, s.tick)
	} else {
		s.timer.Reset(s.interval)
	}
}

func (s *chanState) tick() {
	s.mu.Lock()
	s.armed = false
	s.mu.Unlock()
	_ = s.flush(false, true) // a dead channel: its deliveries are requeued, Ack said so if it could
}

// errChannelGone is what flush returns when the channel died: the caller
// turns it into [sdk.ErrLeaseLost] naming its delivery.
var errChannelGone = errors.New("rabbitmq: consumer channel closed")

// flush sends the acks that wait: one basic.ack with multiple for every
// acked tag below the lowest unsettled one, and a single basic.ack for
// each acked tag above it that has waited so through a whole interval
// (aged: flush is the timer's), for all of them when three quarters of the prefetch
// waits so, and for all of them when force. The others wait for the next flush, when
// the tag below them has likely been settled. It returns errChannelGone, or the send's error,
// when acks could not be sent.
func (s *chanState) flush(force, aged bool) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	s.mu.Lock()
	if s.isDead() {
		n := len(s.acked) + len(s.held)
		s.lost += n
		s.acked, s.held = s.acked[:0], s.held[:0]
		s.mu.Unlock()
		if n > 0 || s.unsure {
			return errChannelGone
		}
		return nil
	}
	low := uint64(math.MaxUint64) // the lowest unsettled tag
	if s.low <= s.last {
		low = s.low
	}
	var hi uint64
	var singles []uint64
	// Acks held above an unsettled tag go out alone once they have waited
	// through a whole interval (held at the previous tick: the first
	// oldHeld of held), or when so many wait that they hold back the
	// prefetch; otherwise they wait on for the gap below them to close.
	crowd := force || len(s.held) >= s.crowdAt
	kept, keptOld := s.held[:0], 0
	for i, t := range s.held {
		old := i < s.oldHeld
		switch {
		case t < low:
			hi = max(hi, t)
		case crowd || aged && old:
			singles = append(singles, t)
		default:
			kept = append(kept, t)
			if old {
				keptOld++
			}
		}
	}
	s.held, s.oldHeld = kept, keptOld
	for _, t := range s.acked {
		switch {
		case t < low:
			hi = max(hi, t)
		case force:
			singles = append(singles, t)
		default:
			s.held = append(s.held, t)
		}
	}
	s.acked = s.acked[:0]
	if aged {
		s.oldHeld = len(s.held)
	}
	if len(s.held) > 0 && !s.armed {
		s.arm()
	}
	s.mu.Unlock()
	// Outside mu, so that Acks do not wait for the socket; flushMu keeps
	// the next flush from computing before these frames are written.
	var err error
	if hi > 0 {
		if s.hook != nil {
			s.hook(hi, true)
		}
		err = s.ch.Ack(hi, true)
	}
	for _, t := range singles {
		if err != nil {
			break
		}
		if s.hook != nil {
			s.hook(t, false)
		}
		err = s.ch.Ack(t, false)
	}
	if err == nil && s.written != nil {
		// SyncAck: Ack returns once its frame is on the socket, not in
		// batchConn's buffer. Also when this flush sent nothing: a flush
		// before it (which held flushMu) may have sent this caller's ack,
		// and a write that failed since lost it.
		if werr := s.written(); werr != nil {
			s.unsure = true
			return errChannelGone
		}
		// And processed by the server, when this flush sent acks. When it
		// sent none, the caller's ack went out with an earlier flush,
		// which held flushMu until its own round trip was back.
		switch {
		case s.processed == nil:
		case hi > 0 || len(singles) > 0:
			if perr := s.processed(); perr != nil {
				s.unsure = true
				return errChannelGone
			}
		case s.unsure:
			return errChannelGone
		}
	}
	if err != nil && (hi > 0 || len(singles) > 0) {
		// This flush may have carried the tags of Acks whose own flushes
		// wait for flushMu and will find nothing to send: they must not
		// report success for frames that failed.
		s.unsure = true
	}
	if err != nil && (s.isDead() || errors.Is(err, amqp.ErrClosed)) {
		return errChannelGone
	}
	return err
}

// close closes the channel (channel.close and its close-ok) under rpcMu,
// so that no other synchronous call on it is in flight (see rpcMu). It
// must not be called with rpcMu held.
func (s *chanState) close() error {
	s.rpcMu.Lock()
	defer s.rpcMu.Unlock()
	return s.ch.Close()
}

func (s *chanState) kill() {
	s.once.Do(func() {
		close(s.dead)
		s.mu.Lock()
		if s.timer != nil {
			s.timer.Stop()
		}
		s.mu.Unlock()
	})
}

func (s *chanState) isDead() bool {
	select {
	case <-s.dead:
		return true
	default:
		return s.ch.IsClosed()
	}
}

// consumerFor returns the queue's consumer, starting it on first use with
// the prefetch of Options.Prefetch, else the receive capacity ctx carries
// ([sdk.ReceiveCapacity]: a Worker's, whatever max its Receive asks for),
// else max; capped at DefaultPrefetch. The prefetch stays the consumer's
// for good: the server ignores a later basic.qos for a running consumer.
func (b *Broker) consumerFor(ctx context.Context, queue string, max int) (*consumer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed() {
		return nil, sdk.ErrClosed
	}
	c := b.consumers[queue]
	if c == nil {
		prefetch := b.opts.Prefetch
		if prefetch == 0 {
			if n := sdk.ReceiveCapacity(ctx); n > 0 {
				max = n
			}
			prefetch = min(max, DefaultPrefetch)
		}
		c = &consumer{b: b, queue: queue, prefetch: prefetch, out: make(chan *delivery, prefetch),
			gone: make(chan struct{}), exited: make(chan struct{}),
			pausing: make(chan struct{}), pauseReq: make(chan struct{}, 1)}
		b.consumers[queue] = c
		b.wg.Add(1)
		go c.run()
		b.startMovers(queue)
	}
	return c, nil
}

func (c *consumer) run() {
	defer c.b.wg.Done()
	defer close(c.exited)
	log := c.b.opts.Logger.With("broker", "rabbitmq", "queue", c.queue)
	for attempt := 1; ; {
		err := c.session()
		if c.b.closed() {
			return
		}
		var ae *amqp.Error
		if c.b.opts.NoDeclare && errors.As(err, &ae) && ae.Code == amqp.NotFound {
			// With NoDeclare nothing here will create the queue: report it
			// to Receive instead of retrying the 404 for ever, and let the
			// next Receive start a new consumer (the queue may exist then).
			c.stop(fmt.Errorf("%w: rabbitmq: queue %q: %w", sdk.ErrNotFound, c.queue, err))
			return
		}
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			// The queue (or its dead-letter queue or exchange) exists with
			// other arguments than this broker declares: no retry will
			// change that. Report it to Receive, as above, rather than
			// retry in the background while Receive waits for ever.
			c.stop(fmt.Errorf("rabbitmq: queue %q: the server holds it, its dead-letter queue or exchange "+
				"with other arguments than Options declare (make them match, or delete it; "+
				"QueueArguments shows a queue's): %w", c.queue, err))
			return
		}
		if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
			// The login may not use the queue (or its companions): no
			// retry will change that either. Report it to Receive, as
			// above; a Worker's Health shows it, where a connection that
			// is up said ready while nothing was consumed.
			c.stop(fmt.Errorf("rabbitmq: queue %q: the server refused access (check the login's permissions): %w", c.queue, err))
			return
		}
		if err == nil { // the channel ran and died: reopen after the shortest backoff
			attempt = 1
		} else {
			log.Warn("rabbitmq consumer", "attempt", attempt, "err", err)
			attempt++
		}
		t := time.NewTimer(c.b.backoff(attempt))
		select {
		case <-t.C:
		case <-c.b.closing:
			t.Stop()
			return
		}
	}
}

// errCancelled is what session returns when the server cancelled the
// consumer (queue deleted, leader moved) before it delivered anything and
// before Options.Reconnect's Max went by: run then backs off further
// instead of re-subscribing at the shortest delay for ever.
var errCancelled = errors.New("rabbitmq: consumer cancelled by the server")

// session opens a channel, consumes until it dies, and returns nil when it
// delivered at least once before dying (or ran for Options.Reconnect's Max).
// A pause (StopReceiving) cancels its consumer and hands back what it held;
// it consumes again on the same channel once a Receive resumes it.
func (c *consumer) session() error {
	start, delivered := time.Now(), false
	ctx, cancel := context.WithCancel(c.b.ctx)
	defer cancel()
	if err := c.b.ensure(ctx, c.queue); err != nil {
		return err
	}
	conn, w, err := c.b.con.getWriter(ctx)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	st := newChanState(ch, w, c.b.opts, c.prefetch, c.b.ackHook)
	c.cur.Store(st)
	defer c.retire(st)
	if err := ch.Qos(c.prefetch, 0, false); err != nil {
		_ = st.close()
		return err
	}
	// While paused no basic.consume tells of the channel's death: this does.
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	// Once the session ends its channel has closed: the server holds nothing
	// for it, so a pause waiting for its hand-back is done.
	defer func() {
		if paused, _, handed := c.pauseState(); paused {
			c.markHanded(handed)
		}
	}()
	for {
		// While paused (StopReceiving) nothing is consumed: a Receive
		// resumes.
		if paused, resumed, handed := c.pauseState(); paused {
			c.markHanded(handed)
			select {
			case <-resumed:
			case <-chClosed:
				// The connection or the channel died: the server requeued
				// what it held. Open another at once (still paused), as
				// when a consuming channel dies, rather than find it dead
				// at the resume.
				return nil
			case <-st.dead:
				_ = st.close()
				return nil
			case <-c.b.closing:
				c.handBack(st, nil, nil, nil, true)
				_ = st.close()
				return nil
			}
			continue
		}
		tag := "berth-" + sdk.NewID()
		// Each basic.consume has a ctx of its own: amqp091 starts a
		// goroutine per ConsumeWithContext that lives until its ctx ends
		// (then sends the basic.cancel) or the channel closes. With the
		// session's ctx every pause, which leaves the channel open, left
		// one behind for the channel's life. A pause's hand-back cancels
		// the consumer by ending it (see handBack).
		cctx, stopConsume := context.WithCancel(ctx)
		st.rpcMu.Lock()
		dels, err := ch.ConsumeWithContext(cctx, c.queue, tag, false, false, false, false, nil)
		st.rpcMu.Unlock()
		if err != nil {
			stopConsume()
			_ = st.close()
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.NotFound {
				c.b.forget(c.queue) // deleted behind our back: declare again next time
			}
			return err
		}
		done, err := c.consume(st, ch, stopConsume, dels, start, &delivered)
		stopConsume()
		if done {
			return err
		}
	}
}

// consume feeds out with the deliveries of dels, the consumer tag's, until
// the channel dies or Close begins (done, with session's result), or a pause
// (StopReceiving) cancelled the consumer and handed back what it held (not
// done: the session waits for a resume on the same channel).
func (c *consumer) consume(st *chanState, ch *amqp.Channel, stopConsume func(), dels <-chan amqp.Delivery, start time.Time, delivered *bool) (done bool, err error) {
	// pause hands back (with pending, a delivery not yet in out) when a
	// pause began; ok is false when it did not and consuming goes on.
	pause := func(pending *delivery) (ok, done bool) {
		paused, _, handed := c.pauseState()
		if !paused {
			return false, false
		}
		alive := c.handBack(st, stopConsume, dels, pending, false)
		c.markHanded(handed)
		if !alive {
			// The channel died (its deliveries are requeued) or the server
			// cancelled the consumer: start over.
			_ = st.close()
			return true, true
		}
		return true, false
	}
	for {
		select {
		case d, ok := <-dels:
			if !ok {
				// The channel died, or the server cancelled the consumer
				// (queue deleted, leader moved): close the channel so that
				// its unacked deliveries go back to the queue either way,
				// and declare the queue again before consuming again.
				cancelled := !ch.IsClosed()
				if cancelled {
					c.b.forget(c.queue)
				}
				_ = st.flush(true, false)
				_ = st.close()
				if cancelled && !*delivered && time.Since(start) < c.b.opts.Reconnect.Max {
					return true, fmt.Errorf("%w: queue %q", errCancelled, c.queue)
				}
				return true, nil
			}
			*delivered = true
			dv := c.wrap(d, st)
			for pushed := false; !pushed; {
				select {
				case c.out <- dv:
					pushed = true
				case <-st.dead:
					return true, nil
				case <-c.b.closing:
					c.handBack(st, stopConsume, dels, dv, true)
					_ = st.close()
					return true, nil
				case <-c.pauseReq:
					if ok, done := pause(dv); ok {
						return done, nil
					}
				}
			}
		case <-st.dead: // abandoned
			_ = st.close()
			return true, nil
		case <-c.b.closing:
			c.handBack(st, stopConsume, dels, nil, true)
			_ = st.close()
			return true, nil
		case <-c.pauseReq:
			if ok, done := pause(nil); ok {
				return done, nil
			}
		}
	}
}

// handBack, when Close begins (closing) or a pause (StopReceiving), returns
// the deliveries of st that no Receive has returned (those waiting in out,
// pending, and those still arriving) without consuming an attempt: it
// cancels the consumer (stopConsume, when dels is not nil: consuming) so
// that no more come, publishes a copy of each carrying its attempt, like Release,
// and acks the originals whose copies were confirmed. Requeueing them
// instead would count a delivery (see the package doc). At Close, whatever
// it cannot hand back goes back when the channel closes, its attempt
// counted; at a pause, which leaves the channel open for the deliveries
// Receive returned, it is requeued (basic.nack) at once. It reports false
// when the channel died or the server cancelled the consumer meanwhile.
//
// Two behaviours of RabbitMQ 3.10's quorum queues shape it; both make the
// server requeue a message with x-delivery-count + 1 that this process
// never saw or had acked, so that it arrives again one attempt up (twice,
// with its copy, in the second case):
//
//   - A delivery that reaches the channel after basic.cancel is returned to
//     the queue by the channel itself (rabbit_fifo_client, a delivery for a
//     consumer tag it no longer knows). Deliveries are on their way while
//     the consumer has credit (prefetch minus what it holds unsettled) and
//     the queue has messages, so before cancelling handBack waits, without
//     acking anything, until the channel holds prefetch unsettled
//     deliveries — then the queue can have sent nothing more — or until no
//     delivery came for cancelQuiet (an idle queue; a message published
//     just then can still be caught), at most a quarter of CloseTimeout.
//   - The channel turns each basic.ack into one settle command to the
//     queue's Raft leader, holds settle commands back while 32 of its
//     commands await application (rabbit_fifo_client's soft limit), and
//     drops those still held when it closes (single acks of 40 then a
//     close: 7 requeued, 40 − 33). A command sent is safe: the leader
//     receives it before the channel's DOWN, both signals of one process.
//     The originals' acks go out through flush, as one basic.ack
//     (multiple) when nothing of the channel below them is unsettled (the
//     usual case: the caller settled what it received before Close), after
//     basic.cancel, which the server answers once the leader applied the
//     cancel, hence every command the channel sent before it. Single acks
//     (a caller closed the broker holding deliveries) can still be held
//     back; the pause (settleGrace) before the channel closes is for them.
func (c *consumer) handBack(st *chanState, stopConsume func(), dels <-chan amqp.Delivery, pending *delivery, closing bool) bool {
	b := c.b
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.CloseTimeout)
	defer cancel()
	// The acks made before Close began go out first, while the channel is
	// certainly ours.
	_ = st.flush(true, false)
	var unseen []*delivery
	take := func(d *delivery) {
		if d != nil && d.st == st && d.settled.CompareAndSwap(false, true) {
			unseen = append(unseen, d)
		}
	}
	// At Close, once no Receive is taking from out (they all see
	// closing), what they took but did not return is in back, and out
	// holds the rest. At a pause a Receive may still take from out: what
	// it takes it returns, and this takes the rest.
	if closing {
		c.recv.Lock()
	}
drain:
	for {
		select {
		case d := <-c.out:
			take(d)
		default:
			break drain
		}
	}
	if closing {
		c.backMu.Lock()
		for _, d := range c.back {
			take(d)
		}
		c.back = nil
		c.backMu.Unlock()
		c.recv.Unlock()
	}
	take(pending)
	if dels != nil {
		if !c.awaitNoCredit(st, dels, take) {
			return false // the channel is gone: the server has requeued them already
		}
		if !c.cancelConsumer(ctx, st, stopConsume, dels, take) {
			return false // the channel is gone: the server has requeued them already
		}
	}
	if len(unseen) == 0 {
		return !st.isDead()
	}
	now := time.Now()
	out := make([]outgoing, len(unseen))
	for i, d := range unseen {
		out[i] = outgoing{id: d.msg.ID, key: c.queue, pub: d.keep.apply(encode(d.msg, d.attempt, now))}
	}
	// By position: the IDs of foreign messages may repeat (see sendEach).
	failed, err := b.sendEach(ctx, out)
	for i, d := range unseen {
		switch {
		case err == nil && (failed == nil || failed[i] == nil):
			_ = st.ack(d.tag)
		case !closing:
			// Not copied: requeued now rather than held for the whole
			// pause (its next delivery counts an attempt).
			_ = st.ch.Nack(d.tag, false, true)
			st.untrack(d.tag)
		}
	}
	_ = st.flush(true, false)
	if !closing {
		return !st.isDead()
	}
	// Single acks among them may be held back by the channel (see above):
	// a short pause lets them go out before the channel closes.
	t := time.NewTimer(settleGrace)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return true
}

// cancelConsumer cancels the consumer of dels by ending its consume's ctx:
// amqp091 then sends basic.cancel (see session), and after basic.cancel-ok
// hands over what it buffered and closes dels, which cancelConsumer takes.
// It holds st.rpcMu until then: the basic.cancel is a call on the channel
// that no other may overlap. It reports false when the channel died, or
// no answer came before ctx ended (amqp091 leaves dels open when the
// cancel fails other than by the channel's close): the caller closes the
// channel, and the server requeues what it held.
func (c *consumer) cancelConsumer(ctx context.Context, st *chanState, stopConsume func(), dels <-chan amqp.Delivery, take func(*delivery)) bool {
	st.rpcMu.Lock()
	defer st.rpcMu.Unlock()
	stopConsume()
	for {
		select {
		case d, ok := <-dels:
			if !ok {
				return !st.isDead()
			}
			take(c.wrap(d, st))
		case <-ctx.Done():
			return false
		}
	}
}

// awaitNoCredit takes the deliveries arriving on dels until st holds
// c.prefetch unsettled ones (the consumer has no credit left: nothing more
// is on its way), no delivery came for cancelQuiet, or a quarter of
// CloseTimeout passed, leaving the rest for the copies (see handBack). It
// reports false when the channel died meanwhile.
func (c *consumer) awaitNoCredit(st *chanState, dels <-chan amqp.Delivery, take func(*delivery)) bool {
	quiet := time.NewTimer(cancelQuiet)
	defer quiet.Stop()
	limit := time.NewTimer(c.b.opts.CloseTimeout / 4)
	defer limit.Stop()
	for st.unsettled() < c.prefetch {
		select {
		case d, ok := <-dels:
			if !ok {
				return false
			}
			take(c.wrap(d, st))
			quiet.Reset(cancelQuiet)
		case <-quiet.C:
			return true
		case <-limit.C:
			return true
		}
	}
	return true
}

// cancelQuiet is how long handBack waits for one more delivery before it
// takes the queue for idle and cancels the consumer with credit left.
const cancelQuiet = 250 * time.Millisecond

// unsettled is how many deliveries the channel handed out and their
// holders have not settled (acked ones leave it when acked, sent or not).
func (s *chanState) unsettled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.unacked)
}

// settleGrace is how long handBack waits between its acks and the channel
// close (see there), and a dead-letter walk before closing its channel.
const settleGrace = 100 * time.Millisecond

// retire marks st dead when its session ends and logs the acks that its
// death dropped unsent (their messages come back: at least once).
func (c *consumer) retire(st *chanState) {
	st.kill()
	st.mu.Lock()
	lost := st.lost + len(st.acked) + len(st.held)
	st.acked, st.held = nil, nil
	st.mu.Unlock()
	if lost > 0 {
		c.b.opts.Logger.Warn("rabbitmq: consumer channel closed with acks not yet sent; the server redelivers those messages",
			"broker", "rabbitmq", "queue", c.queue, "acks", lost)
	}
}

// stop ends the consumer for good with err: Receive returns err, and the
// next Receive of the queue starts a new consumer.
func (c *consumer) stop(err error) {
	c.b.mu.Lock()
	if c.b.consumers[c.queue] == c {
		delete(c.b.consumers, c.queue)
	}
	c.b.mu.Unlock()
	c.err = err
	close(c.gone)
}

func (c *consumer) wrap(d amqp.Delivery, st *chanState) *delivery {
	dec := decode(d.Headers, d.MessageId, d.Type, d.CorrelationId, d.Body)
	attempt := dec.base + min(redeliveries(c.b.opts.QueueType, d.Redelivered, dec.deliveryCnt), maxAttempt-dec.base)
	st.track(d.DeliveryTag)
	return &delivery{c: c, st: st, tag: d.DeliveryTag, msg: dec.msg, keep: carriedOf(d, dec.extra), attempt: attempt}
}

// redeliveries is how many times the server delivered this copy of a
// message before, as far as it can be trusted: what Attempt() adds to the
// attempt header.
//
// The x-delivery-count header is a header like any other, which a producer
// outside berth can set (berth refuses it in a Message's headers), so it is
// trusted only where the server itself writes it: on a quorum queue's
// redelivery, where RabbitMQ sets it to its own count, overwriting any value
// the producer gave (checked on 3.10: a producer's 100 reads 1 on the first
// redelivery). On a first delivery (Redelivered false) the server leaves
// the header as it was published, so it is ignored: the copy has not been
// delivered before. A classic queue never sets it, so there it is ignored
// altogether and a redelivery counts once, as the redelivered flag says (as
// it does on a quorum redelivery without the header).
// Berth's own accounting, the attempt header that Retry and Close's
// hand-back carry, is unaffected.
func redeliveries(qt QueueType, redelivered bool, deliveryCnt int) int {
	if !redelivered {
		return 0
	}
	if qt == Quorum && deliveryCnt >= 0 {
		return deliveryCnt
	}
	return 1
}

// Receive returns between 1 and max deliveries of queue, waiting without
// busy looping while it is empty; it returns ctx.Err() when ctx is done
// (already done: at once, taking nothing) and [sdk.ErrClosed] after Close.
// With [Options.NoDeclare], a queue that does not exist gives an error
// wrapping [sdk.ErrNotFound] and the server's *amqp.Error. A queue that
// exists with other arguments than the broker declares (another queue type,
// dead-letter exchange or delivery limit) gives an error holding the
// server's *amqp.Error 406 (PRECONDITION_FAILED), at once rather than after
// ctx; the next Receive declares again. So does a queue the login may not
// use (403 ACCESS_REFUSED, on the declaration or on basic.consume).
//
// The first Receive of a queue starts a consumer with [Options.Prefetch]
// (default: the receive capacity ctx carries, [sdk.WithReceiveCapacity],
// else this call's max; at most [DefaultPrefetch]); it keeps running
// until Close, holding up to Prefetch messages for this process, and Close
// hands back those no Receive returned without consuming an attempt. A
// Receive that Close overtakes returns [sdk.ErrClosed], never deliveries:
// their settlements would fail, and Close hands them back with the others.
func (b *Broker) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	if max < 1 {
		return nil, fmt.Errorf("%w: rabbitmq: Receive max %d below 1", sdk.ErrInvalidMessage, max)
	}
	// Checked first: with a delivery waiting, the select below would pick
	// between it and ctx.Done() at random, and hand a delivery to a caller
	// that believes it got nothing.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := b.consumerFor(ctx, queue, max)
	if err != nil {
		return nil, err
	}
	if b.receiveHook != nil {
		b.receiveHook()
	}
	pausing := c.resume(ctx) // a pause (StopReceiving) ends with the next Receive
	c.recv.RLock()           // see consumer.recv
	defer c.recv.RUnlock()
	var out []sdk.Delivery
	for len(out) == 0 {
		select {
		case d := <-c.out:
			if !d.st.isDead() {
				out = append(out, d)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-b.closing:
			return nil, sdk.ErrClosed
		case <-c.gone:
			return nil, c.err
		case <-pausing:
			// A pause began while this Receive waited. A Worker's Pause
			// has cancelled ctx first: then this returns. Otherwise this
			// caller still wants messages: consuming resumes.
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			pausing = c.resume(ctx)
		}
	}
more:
	for len(out) < max {
		select {
		case d := <-c.out:
			if !d.st.isDead() {
				out = append(out, d)
			}
		default:
			break more
		}
	}
	if b.closed() {
		// Close began while this Receive took them (the select above
		// picks at random between a delivery and closing): its caller
		// could not settle them (ErrClosed), and left to the channel's
		// close they would come back an attempt up. Close hands them
		// back instead, as it does those no Receive took.
		c.backMu.Lock()
		for _, d := range out {
			c.back = append(c.back, d.(*delivery))
		}
		c.backMu.Unlock()
		return nil, sdk.ErrClosed
	}
	return out, nil
}

var _ sdk.ReceiveStopper = (*Broker)(nil)

// StopReceiving stops queue's consumer taking messages in and hands back
// the deliveries it holds that no Receive has returned (at most
// [Options.Prefetch]) without consuming an attempt: it cancels the consumer
// (basic.cancel), publishes a copy of each carrying its attempt, like
// Release, and acks the originals, as Close does. The channel stays open:
// the deliveries Receive returned settle as usual. The next Receive of queue
// (or one waiting on it whose ctx is not done) consumes again. [sdk.Worker]'s
// Pause calls it. It returns nil when the queue has no consumer, or its
// consumer has no channel open (lost with the connection: the server
// requeued what it held), and [sdk.ErrClosed] after Close. With ctx already
// done it stops nothing and returns ctx.Err().
func (b *Broker) StopReceiving(ctx context.Context, queue string) error {
	if err := sdk.ValidateQueueName(queue); err != nil {
		return err
	}
	// A Worker's Resume cancels the ctx of its Pause's call: one that
	// starts after that must not pause the consumer the Worker resumed.
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.closed() {
		return sdk.ErrClosed
	}
	b.mu.Lock()
	c := b.consumers[queue]
	b.mu.Unlock()
	if c == nil {
		return nil
	}
	handed := c.pause()
	select {
	case <-handed:
		return nil
	case <-c.gone:
		return nil
	case <-b.closing:
		return sdk.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// delivery is one receipt of a message on a consumer channel.
type delivery struct {
	c       *consumer
	st      *chanState
	tag     uint64
	msg     *sdk.Message
	keep    carried // what msg cannot hold, for its copies
	attempt int
	settled atomic.Bool
}

var _ sdk.Releaser = (*delivery)(nil)

func (d *delivery) Message() *sdk.Message { return d.msg }
func (d *delivery) Attempt() int          { return d.attempt }
func (d *delivery) Queue() string         { return d.c.queue }

// ExtendLease does nothing: RabbitMQ holds a delivery until it is settled
// or its channel closes; the server's consumer_timeout (30 minutes by
// default) bounds how long. It returns [sdk.ErrClosed] after Close (like
// the settlements), [sdk.ErrLeaseLost] when the channel is gone and
// [sdk.ErrAlreadySettled] after a settlement.
func (d *delivery) ExtendLease(ctx context.Context, _ time.Duration) error {
	if d.c.b.closed() {
		return sdk.ErrClosed
	}
	if d.settled.Load() {
		return sdk.ErrAlreadySettled
	}
	if d.st.isDead() {
		return d.lost()
	}
	return nil
}

func (d *delivery) lost() error {
	return fmt.Errorf("%w: rabbitmq: the channel of delivery %s closed; the server requeued it", sdk.ErrLeaseLost, sdk.ErrorText(d.msg.ID))
}

// begin claims the delivery's one settlement.
func (d *delivery) begin() error {
	if d.c.b.closed() {
		return sdk.ErrClosed
	}
	if !d.settled.CompareAndSwap(false, true) {
		return sdk.ErrAlreadySettled
	}
	if d.st.isDead() {
		return d.lost()
	}
	return nil
}

func (d *delivery) ack() error {
	if err := d.st.ack(d.tag); err != nil {
		return ackErr(d, err)
	}
	return nil
}

// Ack removes the message (basic.ack). The ack is coalesced with the
// channel's others (see the package doc, "Acknowledgements"): unless
// [Options.SyncAck], Ack returns once it is recorded, and the frame follows
// within [Options.AckInterval]; with SyncAck it returns once the frame is
// written to the socket. It returns an error wrapping
// [sdk.ErrLeaseLost] when the channel is already gone.
func (d *delivery) Ack(ctx context.Context) error {
	if err := d.begin(); err != nil {
		return err
	}
	return d.ack()
}

// Retry publishes a copy with Attempt()+1 through the delay queue of the
// next bucket up from delay (or straight to the queue when delay is 0; the
// largest bucket when delay exceeds it), waits for its confirm, then acks
// this delivery. If the publish fails the
// delivery is requeued (basic.nack) and the error returned.
func (d *delivery) Retry(ctx context.Context, delay time.Duration, cause error) error {
	if err := d.begin(); err != nil {
		return err
	}
	m := d.msg.Clone()
	// The copy carries the first failure to the next attempt and, at last,
	// to the dead letter. A berth-first-failure already on the message is
	// this broker's own from an earlier Retry, or a producer's outside
	// berth (forged, garbage): it is kept only as AnnotateDeadLetter keeps
	// one, an RFC 3339 time not after now (in UTC), else now.
	sdk.SetFirstFailure(m, time.Time{}, time.Now())
	return d.republish(ctx, m, d.attempt+1, delay)
}

// Release hands the message back without consuming an attempt: a copy with
// the same Attempt() goes through the delay path like Retry, then this
// delivery is acked.
func (d *delivery) Release(ctx context.Context, delay time.Duration) error {
	if err := d.begin(); err != nil {
		return err
	}
	return d.republish(ctx, d.msg.Clone(), d.attempt, delay)
}

func (d *delivery) republish(ctx context.Context, m *sdk.Message, attempt int, delay time.Duration) error {
	b := d.c.b
	if delay < 0 {
		delay = 0
	}
	if delay > sdk.MaxDelay {
		delay = sdk.MaxDelay
	}
	key := d.c.queue
	if delay > 0 {
		q, err := b.ensureDelay(ctx, d.c.queue, delay)
		if err != nil {
			return d.requeue(err)
		}
		key = q
	}
	out := []outgoing{{id: m.ID, key: key, pub: d.keep.apply(encode(m, attempt, time.Now()))}}
	if err := b.sendSettlement(ctx, out); err != nil {
		b.forgetUnroutable(err, key)
		return d.requeue(err)
	}
	aerr := d.ack()
	return aerr
}

// sendSettlement sends the copy a settlement needs (Retry's and Release's
// copy, a dead letter), and while the server refuses it (basic.nack) or the
// publishing connection is being replaced, sends it again after the
// Reconnect backoff, until ctx ends. Giving the delivery back at the first
// refusal redelivered it at once, to be refused again: in a cluster test a
// dead-letter queue whose quorum was not yet serving refused copies for a
// few hundred milliseconds, each poison job went round ten times in 140 ms,
// reached the delivery limit and was left to the server's dead-lettering,
// which RabbitMQ 3.10 held for minutes (RELIABILITY.md). A copy returned
// unroutable (its queue is missing) is not sent again here: the settlement
// fails and the next one declares the queue. A copy the login may not
// publish (403, [refused]) is sent again like a nack, paced the same way,
// so that the delivery is not redelivered and run again at once: the
// settlement returns the refusal once ctx ends (with the last attempt's
// error, when ctx cut that one short).
func (b *Broker) sendSettlement(ctx context.Context, out []outgoing) error {
	var refusal error // the last refusal, kept when a later attempt is cut short
	for attempt := 1; ; attempt++ {
		err := b.sendAll(ctx, out)
		var ue *UnroutableError
		again := errors.Is(err, sdk.ErrUnavailable) || refused(err)
		if refused(err) {
			refusal = err
		} else if refusal != nil && err != nil {
			err = errors.Join(refusal, err)
		}
		if err == nil || !again || errors.As(err, &ue) || errors.Is(err, sdk.ErrClosed) {
			return err
		}
		t := time.NewTimer(b.backoff(attempt))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		case <-b.closing:
			t.Stop()
			return err
		}
	}
}

// DeadLetter publishes a copy annotated with the reason headers
// ([sdk.AnnotateDeadLetter]) to the dead-letter exchange, which routes it
// to "<queue>.dlq", waits for the confirm, then acks this delivery. If the
// dead-letter exchange or queue was deleted behind the broker's back, the
// copy fails (an error wrapping [sdk.ErrNotFound]), this delivery is
// requeued, and the next settlement or publish declares them again.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	if err := d.begin(); err != nil {
		return err
	}
	b := d.c.b
	// Declares the dead-letter exchange and queue again if a failed
	// DeadLetter found them missing (forgetUnroutable below).
	if err := b.ensure(ctx, d.c.queue); err != nil {
		return d.requeue(err)
	}
	m := d.msg.Clone()
	now := time.Now()
	sdk.AnnotateDeadLetter(m, d.c.queue, d.attempt, cause, time.Time{}, now)
	pub, err := b.deadLetterCopy(m, d.keep, now)
	if err != nil {
		return d.requeue(err)
	}
	out := []outgoing{{id: m.ID, exchange: b.opts.DeadLetterExchange, key: d.c.queue, pub: pub}}
	if err := b.sendSettlement(ctx, out); err != nil {
		b.forgetUnroutable(err, d.c.queue)
		if errors.Is(err, sdk.ErrNotFound) && !errors.As(err, new(*UnroutableError)) {
			// The server closed the channel with 404: the dead-letter
			// exchange was deleted, and with it the bindings of every
			// dead-letter queue. The next use of each queue declares its
			// topology again (exchange and binding included).
			b.forgetDeclared()
		}
		return d.requeue(err)
	}
	return d.ack()
}

// deadLetterCopy is the publishing of m, a dead letter annotated at now,
// with what its delivery keeps for its copies. When its properties and
// headers do not fit one content header frame of the publishing connection
// (frame_max) it shortens the annotations, never the message
// ([sdk.FitDeadLetter]): first the reason, then every annotation, marked
// [HeaderDeadLetterTruncated]. It keeps room for the stamp a walk of the
// dead-letter queue adds (walkStampRoom): a letter it could not stamp could
// be neither listed past nor redriven. Publish leaves room for the annotations
// (checkFrame), so only another producer's message near the frame gets
// here; before, its copy was refused and the message requeued for ever on a
// classic queue. One within a few dozen bytes of the frame still cannot be
// copied: an error wrapping a [*sdk.MessageTooLargeError], and the
// delivery is requeued.
func (b *Broker) deadLetterCopy(m *sdk.Message, keep carried, now time.Time) (amqp.Publishing, error) {
	fm := int(b.frameMax.Load())
	if fm <= 0 { // no connection yet: its publish checks the frame (write)
		return keep.apply(encode(m, 1, now)), nil
	}
	var p amqp.Publishing // the last encoding: m's as FitDeadLetter leaves it
	err := sdk.FitDeadLetter(m, fm-frameOverhead-walkStampRoom, func(m *sdk.Message) (int, error) {
		p = keep.apply(encode(m, 1, now))
		return contentHeaderSize(p), nil
	})
	if err != nil {
		return amqp.Publishing{}, fmt.Errorf("rabbitmq: dead letter of message %s: its properties and headers do not fit one content header frame (frame_max %d) even without the annotations: %w",
			sdk.ErrorText(m.ID), fm, err)
	}
	return p, nil
}

// walkStampRoom is what a walk's stamp (walkStampHeader, an ID of up to
// 64 bytes) takes in a letter's content header frame.
const walkStampRoom = 1 + len(walkStampHeader) + 5 + 64

// HeaderDeadLetterTruncated marks a dead letter whose annotations berth
// shortened so that it fits one content header frame (see
// [sdk.HeaderDeadLetterTruncated]). A redrive removes it.
const HeaderDeadLetterTruncated = sdk.HeaderDeadLetterTruncated

// forgetUnroutable makes the next use of name declare it again when err says
// a copy sent to it was returned unroutable: a delay queue, or the
// dead-letter queue of the main queue name, deleted behind the broker's
// back. Without it every later settlement through it failed until the
// connection was replaced.
func (b *Broker) forgetUnroutable(err error, name string) {
	var ue *UnroutableError
	if errors.As(err, &ue) {
		b.forget(name)
		b.resetMover(name)
	}
}

// requeue gives the delivery back to the queue after a failed copy and
// returns the cause. The copy may have reached the broker all the same
// (a lost confirm): then the message is delivered twice, never lost.
func (d *delivery) requeue(cause error) error {
	if d.st.isDead() {
		return errors.Join(cause, d.lost())
	}
	defer d.st.untrack(d.tag)
	if err := d.st.ch.Nack(d.tag, false, true); err != nil {
		return errors.Join(cause, d.lost())
	}
	return cause
}

// abandon closes the channel the delivery came on, as a consumer that dies
// would: the server requeues every unsettled delivery of that channel. The
// acks recorded before go out first, as they would from a consumer that
// lived AckInterval longer; TestAckIntervalCrash covers a death within it.
func (d *delivery) abandon() {
	_ = d.st.flush(true, false)
	_ = d.st.close()
	d.st.kill()
}

var _ sdk.BatchAcker = (*Broker)(nil)

// AckBatch acks ds, deliveries this Broker's Receive returned, at once: it
// records them as acked like Ack, then flushes their channels: where every
// delivery a channel handed out up to the highest of them is settled, one
// basic.ack with the multiple flag covers them all; the rest are acked one
// by one. It returns nil or an error joining, per delivery that was not
// acked, an error naming its message and wrapping the cause (the errors of
// Ack: ErrAlreadySettled, ErrLeaseLost, ErrClosed).
func (b *Broker) AckBatch(ctx context.Context, ds []sdk.Delivery) error {
	var errs []error
	fail := func(d sdk.Delivery, err error) {
		errs = append(errs, fmt.Errorf("rabbitmq: ack of message %s: %w", sdk.ErrorText(d.Message().ID), err))
	}
	groups := map[*chanState][]*delivery{}
	var order []*chanState
	for _, sd := range ds {
		d, ok := sd.(*delivery)
		if !ok || d.c.b != b {
			if err := sd.Ack(ctx); err != nil {
				fail(sd, err)
			}
			continue
		}
		if err := d.begin(); err != nil {
			fail(d, err)
			continue
		}
		if _, seen := groups[d.st]; !seen {
			order = append(order, d.st)
		}
		groups[d.st] = append(groups[d.st], d)
	}
	for _, st := range order {
		group := groups[st]
		st.mu.Lock()
		dead := st.isDead()
		if !dead {
			for _, d := range group {
				delete(st.unacked, d.tag)
				st.acked = append(st.acked, d.tag)
			}
			st.advance()
		}
		st.mu.Unlock()
		err := errChannelGone
		if !dead {
			err = st.flush(true, false)
		}
		if err != nil {
			for _, d := range group {
				fail(d, ackErr(d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// ackErr classifies a failed basic.ack of d like delivery.ack does.
func ackErr(d *delivery, err error) error {
	if errors.Is(err, errChannelGone) || d.st.isDead() || errors.Is(err, amqp.ErrClosed) {
		return d.lost()
	}
	return fmt.Errorf("rabbitmq: ack: %w", err)
}
