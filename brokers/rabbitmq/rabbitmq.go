// Package rabbitmq is the RabbitMQ broker of berth, built on
// github.com/rabbitmq/amqp091-go.
//
// It keeps the [sdk.Delivery] contract with RabbitMQ's own primitives:
//
//   - Publish uses publisher confirms, pipelined (a batch is written, then its
//     confirms are awaited together), persistent messages and the mandatory
//     flag: a message no queue takes comes back as an [*UnroutableError].
//     Concurrent publishes share one confirm channel, and the frames written
//     while the socket is busy go out together in its next write, so many
//     goroutines publishing one message each cost the server few reads.
//   - Receive consumes with a prefetch (basic.qos) and manual acks, on a
//     connection of its own, separate from the publishing connection.
//   - Retry(d) publishes a copy carrying the next attempt in the
//     [sdk.HeaderAttempt] header to a delay queue whose per-queue TTL
//     dead-letters it back to the main queue, waits for the confirm, and only
//     then acks the original. DeadLetter publishes an annotated copy to
//     "<queue>.dlq" the same way. A copy the server refuses (basic.nack, as
//     a quorum queue without a serving leader does) is sent again after the
//     Reconnect backoff until the settlement's context ends. If the publish
//     still fails, the original is returned to the queue (basic.nack with
//     requeue): nothing is lost between the two steps, at worst a message is
//     delivered twice.
//   - What a Message cannot hold of a message published outside berth
//     (header values other than strings: numbers, booleans, byte arrays,
//     tables, arrays; the content type and encoding, app ID, reply-to and
//     priority properties) is not in the delivered Message, but every copy
//     berth publishes of it (Retry, Release, DeadLetter, redrive, Close's
//     hand-back) carries it.
//   - A message that kills every worker is dead-lettered by the broker itself:
//     quorum queues are declared with x-delivery-limit, and dead-letter at
//     least once (x-dead-letter-strategy at-least-once, x-overflow
//     reject-publish).
//   - Attempt() is the attempt header (1 when absent) plus the quorum queue's
//     x-delivery-count, so it counts SDK retries and crash redeliveries alike.
//     Classic queues carry only a redelivered flag: a crash redelivery counts
//     as one more attempt however many times it happened. An
//     x-delivery-count set by a producer is ignored: it is read only on a
//     quorum queue's redelivery, where the server writes its own.
//   - When a connection or channel dies the broker reconnects with backoff,
//     declares its queues again and resumes consuming. Deliveries from the
//     dead channel are not acked on the new one: settling them returns an
//     error wrapping [sdk.ErrLeaseLost] (the broker has already put them back).
//
// # Delays
//
// RabbitMQ has no per-message delay without a plugin. Message.Delay and
// Retry(d) use a fixed set of delay queues per main queue ("buckets",
// [Options.DelayBuckets]), each with one TTL, dead-lettering back to the main
// queue. A delay is rounded up to the next bucket, so a message is never
// delivered early; it may be late by up to the gap to that bucket plus the
// time the server takes to expire it (under 0.1s in this package's tests). With
// the default buckets (250ms, 500ms, 1s, 2s, 5s, 10s, 30s, 1m, 2m, 5m, 10m,
// 30m, 1h, 2h, 6h, 12h) a delay of 250ms or more waits at most 3× as long
// (10.1s becomes 30s, 2.1s becomes 5s); a shorter one waits 250ms. The
// default largest bucket is [sdk.MaxDelay] (12h), the longest delay berth
// allows. With custom buckets, a Publish delay beyond the largest is refused
// ([*DelayError]); a Retry delay beyond it is cut to it (that retry comes
// early), so keep the largest bucket at or above the Worker's backoff
// maximum. Expiry is per queue and in order, so a short delay is never held
// up behind a long one. A delay queue is declared the first time it is
// needed (unless NoDeclare; then declare the buckets with the topology you
// manage: [DelayQueue] names them; each has x-message-ttl and dead-letters
// to the default exchange with the main queue as routing key).
//
// A process that consumes a queue also moves the messages of its delay
// queues up to [Options.MoveDelaysUpTo] (10m by default) back itself: a
// mover per bucket consumes the delay queue, holds each delivery for the
// bucket's TTL from its arrival (on a connection of its own), publishes a
// copy to the main queue with a publisher confirm and acks the delivery once the copy is confirmed (a
// crash in between leaves the message twice, never none). A held delivery
// is not ready, so the server does not expire it; what no mover holds (no
// process consumes the queue, a mover's prefetch is full, or the bucket is
// longer) still expires and is dead-lettered by the server. The reason is
// RabbitMQ's at-least-once dead-lettering on a cluster: on 3.10, when the
// main queue's leader node dies, the delay queue's dead-letter worker's
// first forward to the main queue can fail; it then marks the message
// rejected and tries again only after dead_letter_worker_publisher_confirm_timeout
// (3 minutes by default), and with 32 such messages pending it takes no more,
// so every retry through that bucket was held for 3 to 6 minutes
// (RELIABILITY.md). A mover publishes through an ordinary channel, which
// follows the new leader. A moved message is late by the time it waited in
// the delay queue before a mover took it (milliseconds while a mover runs);
// it is never early. A delivery a mover's channel or a stopped process
// handed back is redelivered, and its wait counts from the AMQP timestamp
// of the copy berth put in the delay queue (whole seconds: at most a
// second late), not again from its redelivery, which stretched the delay
// by up to one more TTL; that "never early" is then on the sending
// process's clock. [Broker.Info] counts the deliveries this process's
// movers hold as Delayed; those held by other processes are not visible
// through AMQP.
//
// # Prefetch and attempts
//
// The first Receive of a queue starts a consumer that keeps up to
// [Options.Prefetch] messages in this process until they are settled or the
// broker is closed, whether or not Receive is called again. By default the
// prefetch is the receive capacity the first Receive's ctx carries
// ([sdk.WithReceiveCapacity]), which for an [sdk.Worker] is its capacity
// (Concurrency + Prefetch) however few slots that Receive asks for, else
// that Receive's max. Close hands back the deliveries that
// no Receive returned without consuming an attempt (a Receive that Close
// overtakes returns [sdk.ErrClosed] and leaves what it had taken to this
// hand-back, rather than return deliveries its caller could no longer
// settle; what a Receive did return before Close began and is unsettled
// goes back with the channel's close, an attempt counted): it waits until the
// consumer holds its whole prefetch (so that no delivery is on its way,
// which RabbitMQ 3.10 would return with x-delivery-count raised once the
// consumer is cancelled) or the queue looks idle, cancels the consumer
// (basic.cancel), publishes a copy of each with its attempt in the attempt
// header, waits for the confirms and acks the originals (one basic.ack
// when nothing below them is unsettled), within [Options.CloseTimeout].
// (Requeueing them would cost an attempt: on a quorum queue every return, by nack, reject or channel close, raises
// x-delivery-count on RabbitMQ 3.x and 4.0–4.2, and on a classic queue sets
// the redelivered flag.) If the process dies, the server redelivers
// everything it held with x-delivery-count raised, so a prefetched message
// counts an attempt even if no handler saw it.
//
// [Broker.StopReceiving] ([sdk.ReceiveStopper]; [sdk.Worker.Pause] calls it)
// does the same for one queue without closing anything: the consumer is
// cancelled and what it holds that no Receive returned is handed back as
// above, so that while a Worker is paused its prefetched messages go to
// the other consumers rather than stay unacked in this process for the
// whole pause; a copy that fails is requeued (basic.nack), its attempt
// counted. The channel stays open for the deliveries Receive returned. The
// next Receive of the queue, or one waiting on it whose ctx is not done,
// consumes again on the same channel. A paused consumer whose channel dies
// (the connection lost) opens another at once, still paused; while it has
// none, StopReceiving has nothing to hand back and returns at once.
//
// # Leases
//
// RabbitMQ has no visibility timeout: a delivery is held until it is settled
// or its channel closes. ExtendLease is therefore a no-op; a consumer that
// hangs is detected by the server's consumer_timeout (30 minutes by default),
// which closes the channel and requeues its deliveries.
//
// # Acknowledgements
//
// Acks are coalesced per consumer channel, as a careful amqp091-go user
// does by hand: Ack records the delivery as acked and returns; the acks go
// out together, as one basic.ack with the multiple flag, when a quarter of
// the prefetch has been acked or [Options.AckInterval] (2ms by default)
// after the first, and when the Worker drains ([Broker.Flush]) or the
// broker closes. A multiple ack covers every unsettled delivery of its
// channel up to its tag, so it is sent only up to the lowest delivery
// whose holder has not settled it: an ack is never sent for work that has
// not finished, and never on another channel than the delivery's (after a
// reconnection, settling a delivery of the old channel still returns
// [sdk.ErrLeaseLost]). An ack above an unsettled delivery waits up to two
// intervals for the gap to close, then goes out alone (at once when three
// quarters of the prefetch wait so). Retry, Release and
// DeadLetter ack their original the same way once the copy is confirmed;
// their requeue on failure (basic.nack) is sent at once.
//
// The price is the interval: a process that dies within it of an Ack loses
// that ack, and the server redelivers the message, as it would had the
// process died just before acking (delivery is at least once; the
// idempotency and ledger layers make the effect once). The same happens when
// the channel dies with acks waiting (logged, with their count). With
// [Options.SyncAck] every ack is written to the socket and processed by the
// server (a synchronous round trip on the channel after it) before Ack
// returns, so the death of the process no longer loses it.
//
// # Credentials
//
// The URL's password never appears in an error or a log record: errors and
// logs carry the redacted URL (see [Redact]). amqps:// URLs use
// [Options.TLS] (or the system roots when it is nil). Connection failures
// wrap [sdk.ErrUnavailable]; a refused login, an unknown vhost or an
// untrusted certificate do not, since waiting does not fix them. Nor does
// a refusal of what the login may do (403 ACCESS_REFUSED): Receive of a
// queue it may not read, Publish or PublishAsync to an exchange it may not
// write (the default exchange is amq.default to permissions) fail with the
// server's *amqp.Error, not [sdk.ErrUnavailable]; the next call tries again.
// A settlement's copy so refused is sent again, paced by Options.Reconnect,
// until the settlement's ctx ends; then the delivery is requeued.
//
// # Inspection
//
// Without the management plugin AMQP reports a queue's ready messages and
// consumers ([Broker.Info]); [Broker.Stats] fills Ready, Delayed and
// DeadLettered and leaves InFlight and OldestAge at 0.
//
// # Dead letters
//
// AMQP cannot read a queue without taking its messages, so listing, showing,
// redriving and deleting dead letters walk the dead-letter queue once round,
// a page at a time (100 letters, or fewer once their bodies reach 32 MiB),
// with basic.get on a channel of their own: each letter of a page is kept
// (republished as it is, headers and x-death included, to the tail of the
// dead-letter queue), redriven or deleted, and the original is acked once
// its copy is confirmed. After the letters the queue held when the walk
// began have all gone round, the queue is in its old order again; memory
// holds one page, whatever the queue holds, and the time grows with the
// queue. A redrive or delete of chosen IDs walks twice: once to check them
// (unknown IDs change nothing), once to move them.
//
// Keeping a letter by republishing it, not by closing the channel, is what
// keeps listings from wearing dead letters out: a message returned by
// closing the channel (or nack) has x-delivery-count raised on a quorum
// queue, and a delivery limit on the dead-letter queue would drop it after
// that many listings; a copy starts with no delivery count. So berth
// declares the dead-letter queue with no x-delivery-limit of its own:
// whatever limit the server applies (RabbitMQ 4's default of 20, or one an
// operator sets by policy) is never reached by walks. (Setting one, or -1
// for none, would make the declaration differ from existing dead-letter
// queues, which RabbitMQ refuses with PRECONDITION_FAILED, and -1 is
// refused before RabbitMQ 4.) Only a walk whose connection dies counts a
// delivery, once, for the page it held.
//
// A crash in the middle leaves a dead letter twice (copy confirmed, original
// not yet acked), never none; dead letters arriving during a walk may end
// up before the ones it keeps; a walk interrupted by its ctx finishes its
// page and leaves the queue turned part of the way round. Two walks at once
// take letters from under each other: a walk that meets its own copies
// before it has seen every letter stops with a [*ScanError] (wrapping
// [ErrScanIncomplete]) saying how many it did not look at, rather than
// seeing letters twice.
//
// A redrive or sweep reports exactly what it did, also when an error ends
// it part-way: it returns how many letters it moved with the error, and
// when some redrives had failed before it (they are still dead letters), a
// [*WalkError] naming them ([errors.As] finds the *[sdk.PublishError]). A
// letter whose copy went out but whose original could not be acked (the
// channel died) is named too: it is then on both queues.
package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// QueueType is the kind of RabbitMQ queue berth declares.
type QueueType string

// The queue types.
const (
	// Quorum queues are replicated, count deliveries (x-delivery-count),
	// enforce a delivery limit and dead-letter at least once. The default.
	Quorum QueueType = "quorum"
	// Classic queues are faster on a single node but have no delivery limit:
	// a message that kills every worker is redelivered forever, and Attempt()
	// sees at most one crash redelivery per copy (the redelivered flag).
	Classic QueueType = "classic"
)

// DefaultDelayBuckets are the delay queues' TTLs used when
// [Options.DelayBuckets] is empty.
var DefaultDelayBuckets = []time.Duration{
	250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second,
	10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
	10 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour,
}

// Defaults of [Options].
const (
	// DefaultPrefetch caps the prefetch that follows the first Receive's
	// receive capacity, or max, when [Options.Prefetch] is 0.
	DefaultPrefetch           = 64
	DefaultCloseTimeout       = 5 * time.Second
	DefaultMaxDeliveries      = 10
	DefaultMaxMessageSize     = 16 << 20
	DefaultDeadLetterExchange = "berth.dlx"
	DefaultUnavailableAfter   = 30 * time.Second
)

// Options configures a [Broker]. The zero value is a sensible broker.
type Options struct {
	// TLS configures amqps:// connections. Nil uses the system roots.
	TLS *tls.Config
	// QueueType of the queues berth declares. Default [Quorum].
	QueueType QueueType
	// MaxDeliveries is how many times a message may be delivered without
	// being settled before the broker dead-letters it (quorum queues only;
	// x-delivery-limit is MaxDeliveries-1). Default 10.
	MaxDeliveries int
	// Prefetch is the per-queue consumer prefetch (basic.qos): how many
	// deliveries the broker hands this process before they are settled.
	// Default: the receive capacity the queue's first Receive carries in
	// its ctx ([sdk.WithReceiveCapacity]), else that Receive's max. An
	// [sdk.Worker] receives under its capacity (Concurrency + Prefetch),
	// also with several Queues, whose Receives ask for a queue's share of
	// the slots only, so the server hands this process, for each queue, no
	// more than the Worker can hold (at most [DefaultPrefetch]). Set it when a caller
	// that declares no capacity asks for fewer in its first Receive than it
	// will hold at once: with prefetch n, a caller holding n unsettled
	// deliveries gets no more.
	Prefetch int
	// CloseTimeout bounds how long Close spends handing back deliveries
	// that this process holds but no caller has received (they are
	// requeued with their attempt unchanged); past it they go back when the
	// connection closes, with a delivery counted. Default 5s.
	CloseTimeout time.Duration
	// MaxMessageSize is the limit, as [sdk.Message.Size] counts, checked
	// before publishing. Default 16 MiB (the server's own default limit is
	// 128 MiB).
	MaxMessageSize int
	// DelayBuckets are the TTLs of the delay queues. Default
	// [DefaultDelayBuckets]. Every bucket must be at least 1ms; one that is
	// not a whole number of milliseconds (the unit of a queue's TTL) is
	// rounded up to the next. The largest
	// bounds Publish delays ([*DelayError]) and cuts longer Retry delays.
	DelayBuckets []time.Duration
	// DeadLetterExchange is the direct exchange dead letters go through.
	// Default "berth.dlx".
	DeadLetterExchange string
	// NoDeclare skips topology declaration on first use, for teams that
	// manage queues elsewhere. [Broker.DeclareQueue] still declares.
	NoDeclare bool
	// UnavailableAfter bounds how long Publish and settlements wait for a
	// lost connection to come back before failing with an error wrapping
	// [sdk.ErrUnavailable]. The caller's ctx bounds it too. Default 30s.
	UnavailableAfter time.Duration
	// ConnectionName is the client-provided connection name shown by
	// rabbitmqctl; "-publish" and "-consume" are appended. Default "berth".
	ConnectionName string
	// Heartbeat is the AMQP heartbeat interval, in whole seconds (the
	// server may ask for less); below one second is refused, as AMQP
	// would turn it into the server's interval. A frozen (half-open) connection is noticed
	// when nothing was read for 1.5 intervals, then reconnected. Default
	// 10s.
	Heartbeat time.Duration
	// Reconnect is the backoff between reconnection attempts. Default base
	// 100ms, max 5s.
	Reconnect sdk.Backoff
	// Logger receives reconnection logs. Default slog.Default().
	Logger *slog.Logger
	// MoveDelaysUpTo is the longest delay bucket whose messages a process
	// that consumes the main queue moves back to it itself, holding each
	// for the bucket's TTL, instead of leaving them to the server's
	// dead-lettering (see "Delays" in the package doc). Keep it well under
	// the server's consumer_timeout (30 minutes by default), which bounds
	// how long a delivery may be held. Default [DefaultMoveDelaysUpTo];
	// negative: no bucket, every delay is the server's.
	MoveDelaysUpTo time.Duration
	// MaxInFlight bounds the messages published with
	// [Broker.PublishAsync] whose confirms have not come back: the sliding
	// window of publisher confirms. PublishAsync blocks beyond it. Default
	// [DefaultMaxInFlight].
	MaxInFlight int
	// AckInterval is how long an Ack may wait for the acks of its channel
	// to go out together, in one basic.ack with the multiple flag (see the
	// package doc, "Acknowledgements"). A quarter of the prefetch waiting
	// sends them sooner. Default [DefaultAckInterval].
	AckInterval time.Duration
	// SyncAck sends every ack before Ack returns, coalesced only with acks
	// already waiting: Ack (and AckBatch, and the ack of a settlement's
	// original) returns only once the basic.ack frame has been written to
	// the connection's socket and the server has processed it, so a
	// process that dies right after an Ack, even by SIGKILL, cannot lose
	// it. AMQP 0-9-1 does not confirm acks, so the flush that sends them
	// makes a synchronous round trip on the channel after them (basic.qos
	// with the channel's prefetch, which changes nothing): the server
	// handles a channel's methods in order. A frame only written to the
	// socket was not enough: a process killed with unread data in its
	// receive queue resets the connection, which discards what the server
	// had not read yet. When the round trip fails, Ack returns
	// [sdk.ErrLeaseLost] (the ack may or may not have been processed; the
	// server redelivers an unprocessed one). Each Ack then waits for a
	// round trip, shared by the acks that went out together. Default false.
	SyncAck bool
}

// DefaultAckInterval is the default [Options.AckInterval].
const DefaultAckInterval = 2 * time.Millisecond

// DefaultMaxInFlight is the default [Options.MaxInFlight].
const DefaultMaxInFlight = 256

func (o Options) withDefaults() (Options, error) {
	switch o.QueueType {
	case "":
		o.QueueType = Quorum
	case Quorum, Classic:
	default:
		return o, fmt.Errorf("rabbitmq: unknown QueueType %q", o.QueueType)
	}
	if o.MaxDeliveries < 0 || o.Prefetch < 0 || o.MaxMessageSize < 0 || o.UnavailableAfter < 0 || o.Heartbeat < 0 {
		return o, errors.New("rabbitmq: negative option")
	}
	if o.MaxDeliveries == 0 {
		o.MaxDeliveries = DefaultMaxDeliveries
	}
	if o.CloseTimeout < 0 {
		return o, errors.New("rabbitmq: negative option")
	}
	if o.CloseTimeout == 0 {
		o.CloseTimeout = DefaultCloseTimeout
	}
	if o.Prefetch > 65535 {
		return o, errors.New("rabbitmq: Prefetch above 65535")
	}
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = DefaultMaxMessageSize
	}
	if len(o.DelayBuckets) == 0 {
		o.DelayBuckets = DefaultDelayBuckets
	}
	o.DelayBuckets = slices.Clone(o.DelayBuckets)
	for i, d := range o.DelayBuckets {
		if d < time.Millisecond {
			return o, fmt.Errorf("rabbitmq: delay bucket %s below 1ms", d)
		}
		// A delay queue's TTL (x-message-ttl) and name are in whole
		// milliseconds: rounded down, a bucket would deliver early.
		if r := d % time.Millisecond; r > 0 {
			if d > math.MaxInt64-time.Millisecond {
				return o, fmt.Errorf("rabbitmq: delay bucket %s too long", d)
			}
			o.DelayBuckets[i] = d - r + time.Millisecond
		}
	}
	slices.Sort(o.DelayBuckets)
	o.DelayBuckets = slices.Compact(o.DelayBuckets)
	if o.DeadLetterExchange == "" {
		o.DeadLetterExchange = DefaultDeadLetterExchange
	}
	if o.UnavailableAfter == 0 {
		o.UnavailableAfter = DefaultUnavailableAfter
	}
	if o.ConnectionName == "" {
		o.ConnectionName = "berth"
	}
	if o.Heartbeat > 0 && o.Heartbeat < time.Second {
		// AMQP negotiates whole seconds: amqp091 would send 0, "use the
		// server's" (60 s by default), not the half second asked for.
		return o, fmt.Errorf("rabbitmq: Heartbeat %s is below AMQP's resolution of one second", o.Heartbeat)
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = 10 * time.Second
	}
	if o.Reconnect.Base <= 0 {
		o.Reconnect.Base = 100 * time.Millisecond
	}
	if o.Reconnect.Max <= 0 {
		o.Reconnect.Max = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxInFlight < 0 {
		return o, errors.New("rabbitmq: negative option")
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.AckInterval < 0 {
		return o, errors.New("rabbitmq: negative option")
	}
	if o.AckInterval == 0 {
		o.AckInterval = DefaultAckInterval
	}
	if o.MoveDelaysUpTo == 0 {
		o.MoveDelaysUpTo = DefaultMoveDelaysUpTo
	}
	return o, nil
}

// Broker is a RabbitMQ [sdk.Broker]. It also implements [sdk.QueueDeclarer],
// [sdk.Inspector] and [sdk.DeadLetters]; its deliveries implement
// [sdk.Releaser]. All methods may be called concurrently.
type Broker struct {
	opts     Options
	redacted string
	uri      string

	pub *link // publishing, settlement copies, topology, dead letters
	con *link // consuming
	mov *link // the delay movers', dialed when the first starts (delays.go)

	closing   chan struct{}   // closed when Close begins
	done      chan struct{}   // closed once Close has handed deliveries back
	ctx       context.Context // cancelled by Close; bounds background work
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup

	pcCur [pubKinds]atomic.Pointer[pubChannel] // the confirm channels (see publisher)

	// frameMax is the frame_max the publishing connection negotiated (0:
	// none yet, or no limit): a message's properties and headers travel in
	// one content header frame, which cannot be split (see checkFrame).
	frameMax atomic.Int64

	mu        sync.Mutex          // never held across a server round trip (see publisher)
	pcOpening [pubKinds]*chanOpen // each kind's confirm channel being opened, under mu (see publisher)
	consumers map[string]*consumer
	movers    map[string]*mover       // by delay queue name
	declared  map[string]bool         // queue names (main queues and delay queues) declared on the current connection
	declaring map[string]*declareCall // declarations in flight, by queue name
	absent    map[string]time.Time    // delay queues Info found missing, and when (inspect.go)

	absentRecheck time.Duration // how long Info trusts an entry of absent; tests shorten it

	randMu sync.Mutex
	rand   *rand.Rand

	window chan struct{} // one token per unconfirmed PublishAsync message

	walkTune walkTuning // bounds of dead-letter walks (dlqwalk.go)

	ackHook     func(tag uint64, multiple bool) // tests: sees every ack frame of the consumer channels
	inspectHook func(name string)               // tests: sees every passive lookup of a queue
	receiveHook func()                          // tests: runs in Receive once it has its consumer, before it takes deliveries
}

var (
	_ sdk.Broker             = (*Broker)(nil)
	_ sdk.ConnectionReporter = (*Broker)(nil)
	_ sdk.QueueDeclarer      = (*Broker)(nil)
	_ sdk.Inspector          = (*Broker)(nil)
	_ sdk.DeadLetters        = (*Broker)(nil)
	_ sdk.AsyncPublisher     = (*Broker)(nil)
	_ sdk.Flusher            = (*Broker)(nil)
)

// Flush sends the acks that wait for their interval now (see the package
// doc, "Acknowledgements"); the Worker calls it when it drains. It returns
// [sdk.ErrClosed] after Close, and an error wrapping [sdk.ErrLeaseLost]
// only when it finds a consumer channel dead with acks waiting, or one
// dies while Flush sends them (with [Options.SyncAck], also when the
// server's answer to an earlier ack flush never came). Acks a channel's
// death dropped before Flush ran are not reported by it: the consume loop
// logs them, with their count, when it retires the channel, and the
// server redelivers their messages (at least once, as when the process
// dies within the interval). So a Worker that survived an outage does
// not fail its Run for acks the outage took.
func (b *Broker) Flush(ctx context.Context) error {
	if b.closed() {
		return sdk.ErrClosed
	}
	b.mu.Lock()
	cs := make([]*consumer, 0, len(b.consumers))
	for _, c := range b.consumers {
		cs = append(cs, c)
	}
	b.mu.Unlock()
	var errs []error
	for _, c := range cs {
		st := c.cur.Load()
		if st == nil {
			continue
		}
		if err := st.flush(true, false); err != nil {
			errs = append(errs, fmt.Errorf("%w: rabbitmq: acks of queue %q not sent: %w", sdk.ErrLeaseLost, c.queue, err))
		}
	}
	return errors.Join(errs...)
}

// New connects to the RabbitMQ at rawURL (amqp:// or amqps://) with two
// connections, one to publish and one to consume, and returns the broker
// (the first Receive adds a third, "-move", for the delay movers).
// While the server cannot be reached it retries with the
// [Options.Reconnect] backoff until ctx ends, then fails with an error
// wrapping [sdk.ErrUnavailable]; a refused login or an untrusted certificate
// fail at once. It never puts the URL's password in an error.
func New(ctx context.Context, rawURL string, opts Options) (*Broker, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	redacted, err := Redact(rawURL)
	if err != nil {
		return nil, err
	}
	if _, err := amqp.ParseURI(rawURL); err != nil {
		return nil, fmt.Errorf("rabbitmq: invalid URL %s", redacted)
	}
	b := &Broker{
		opts:      opts,
		redacted:  redacted,
		uri:       rawURL,
		closing:   make(chan struct{}),
		done:      make(chan struct{}),
		consumers: make(map[string]*consumer),
		movers:    make(map[string]*mover),
		declared:  make(map[string]bool),
		declaring: make(map[string]*declareCall),
		absent:    make(map[string]time.Time),

		absentRecheck: absentRecheck,
		rand:          rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		window:        make(chan struct{}, opts.MaxInFlight),
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.pub = &link{b: b, name: opts.ConnectionName + "-publish", up: make(chan struct{})}
	b.con = &link{b: b, name: opts.ConnectionName + "-consume", up: make(chan struct{})}
	pubConn, pubW, err := b.pub.dialRetry(ctx)
	if err != nil {
		b.cancel()
		return nil, err
	}
	conConn, conW, err := b.con.dialRetry(ctx)
	if err != nil {
		b.cancel()
		_ = pubConn.CloseDeadline(time.Now().Add(opts.CloseTimeout))
		return nil, err
	}
	b.wg.Add(2)
	b.pub.set(pubConn, pubW)
	b.con.set(conConn, conW)
	go b.pub.supervise(pubConn)
	go b.con.supervise(conConn)
	return b, nil
}

// Redact returns rawURL with its password replaced by "xxxxx", for logs and
// errors. An unparsable URL gives an error that does not contain it.
func Redact(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", errors.New("rabbitmq: invalid URL (not shown: it may hold credentials)")
	}
	return u.Redacted(), nil
}

// Close closes the connections and stops the broker's goroutines. Unsettled
// deliveries go back to their queues. PublishAsync results still waiting
// for their confirms get them first, within [Options.CloseTimeout]; past it
// they resolve [sdk.ErrClosed] (perhaps published). It is safe to call twice, also
// concurrently: later Closes return nil once the first has finished; every
// other call on the broker returns [sdk.ErrClosed].
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		// First every call on the broker starts returning ErrClosed, and
		// the consumers hand back what this process holds but no caller
		// has seen (see consumer.handBack), through connections still up.
		b.mu.Lock()
		close(b.closing)
		cs := make([]*consumer, 0, len(b.consumers))
		for _, c := range b.consumers {
			cs = append(cs, c)
		}
		b.mu.Unlock()
		// One deadline for all the consumers, which hand back concurrently:
		// once it has passed, it stays passed for the ones not yet waited
		// for (a timer's channel fires once, for one of them only).
		limit, stop := context.WithTimeout(context.Background(), b.opts.CloseTimeout)
		defer stop()
		for _, c := range cs {
			select {
			case <-c.exited:
			case <-limit.Done():
				// The connection is stuck: what is left goes back when it
				// closes, with a delivery counted.
			}
		}
		// PublishAsync's messages already written get their confirms,
		// within the same deadline: a result failed ErrClosed ("perhaps
		// published") for a message the queue holds makes its producer
		// retry or report it for nothing. No new one starts (closing).
		if len(b.window) > 0 {
			tick := time.NewTicker(5 * time.Millisecond)
			for len(b.window) > 0 && limit.Err() == nil {
				select {
				case <-tick.C:
				case <-limit.Done():
				}
			}
			tick.Stop()
		}
		// Under mu: consumerFor and publisher start goroutines (wg.Add)
		// only after checking done under mu, so none starts after Wait.
		b.mu.Lock()
		close(b.done)
		b.mu.Unlock()
		b.cancel()
		b.wg.Wait()
	})
	return nil
}

// closed reports whether Close has begun: public calls return ErrClosed.
func (b *Broker) closed() bool {
	select {
	case <-b.closing:
		return true
	default:
		return false
	}
}

// stopped reports whether Close has ended the broker's goroutines (done
// closed); between closed and stopped, Close hands deliveries back.
func (b *Broker) stopped() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

func (b *Broker) backoff(attempt int) time.Duration {
	b.randMu.Lock()
	u := b.rand.Float64()
	b.randMu.Unlock()
	return b.opts.Reconnect.Delay(attempt, u)
}

// sleep waits d, or until the broker closes (false).
func (b *Broker) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-b.done:
		return false
	}
}

// link is one supervised AMQP connection: it reconnects with backoff when the
// connection dies, until the broker closes.
type link struct {
	b    *Broker
	name string

	mu      sync.Mutex
	conn    *amqp.Connection // nil while down
	w       *batchConn       // conn's socket writer (see Options.SyncAck)
	up      chan struct{}    // closed while conn is usable
	downErr error            // why conn is down: the loss, then the last failed reconnect
}

// ConnectionError implements [sdk.ConnectionReporter]: nil while the
// consuming connection is up, else why it is down (the loss, then the
// last failed reconnect), wrapping [sdk.ErrUnavailable]; [sdk.ErrClosed]
// once the broker is closed. A Receive waits through a reconnection instead
// of failing, so this is how [sdk.Worker.Health] learns of an outage.
func (b *Broker) ConnectionError() error {
	select {
	case <-b.closing:
		return sdk.ErrClosed
	default:
	}
	l := b.con
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil && !l.conn.IsClosed() {
		return nil
	}
	if l.downErr != nil {
		return fmt.Errorf("%w: rabbitmq: %s connection down: %w", sdk.ErrUnavailable, l.name, l.downErr)
	}
	return fmt.Errorf("%w: rabbitmq: %s connection down", sdk.ErrUnavailable, l.name)
}

// dialRetry dials until it succeeds, the error is not worth waiting for
// (credentials, certificate), or ctx ends: a process started while the
// server restarts waits for it, as long as its ctx allows, with the
// Options.Reconnect backoff. The error is the last dial's.
func (l *link) dialRetry(ctx context.Context) (*amqp.Connection, *batchConn, error) {
	for attempt := 1; ; attempt++ {
		c, w, err := l.dial(ctx)
		if err == nil || !errors.Is(err, sdk.ErrUnavailable) || ctx.Err() != nil {
			return c, w, err
		}
		t := time.NewTimer(l.b.backoff(attempt))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, nil, err
		}
	}
}

// dial opens a connection and returns it with the batchConn that writes
// its frames to the socket.
func (l *link) dial(ctx context.Context) (*amqp.Connection, *batchConn, error) {
	const handshake = 30 * time.Second
	// amqp091 dials without a context: the Dial hook bounds the TCP connect
	// by ctx and the TLS and AMQP handshakes by a deadline that ctx can
	// bring forward.
	var stop func() bool
	var w *batchConn
	cfg := amqp.Config{
		// A copy per dial: amqp091 writes ServerName into the config it
		// is given, and the caller's may be shared.
		TLSClientConfig: l.b.opts.TLS.Clone(),
		Heartbeat:       l.b.opts.Heartbeat,
		Properties:      amqp.Table{"connection_name": l.name, "product": "berth"},
		Locale:          "en_US",
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: handshake}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			deadline := time.Now().Add(handshake)
			if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
				deadline = dl
			}
			if err := c.SetDeadline(deadline); err != nil {
				_ = c.Close()
				return nil, err
			}
			stop = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
			w = newBatchConn(c)
			return w, nil
		},
	}
	conn, err := amqp.DialConfig(l.b.uri, cfg)
	if stop != nil && !stop() && err == nil {
		// ctx ended just as the handshake finished: the deadline it set
		// would break the connection later.
		_ = conn.Close()
		conn, err = nil, ctx.Err()
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("%w: rabbitmq: connect to %s: %w", sdk.ErrUnavailable, l.b.redacted, ctx.Err())
		}
		cause := safeErr(err, l.b.uri)
		var ae *amqp.Error
		var ce *tls.CertificateVerificationError
		if errors.As(err, &ae) && (ae.Code == amqp.AccessRefused || ae.Code == amqp.NotAllowed) ||
			errors.As(err, &ce) {
			// Wrong credentials, vhost or certificate: waiting will not help.
			return nil, nil, fmt.Errorf("rabbitmq: connect to %s: %w", l.b.redacted, cause)
		}
		return nil, nil, fmt.Errorf("%w: rabbitmq: connect to %s: %w", sdk.ErrUnavailable, l.b.redacted, cause)
	}
	return conn, w, nil
}

// safeErr returns err, or, if its text holds the URL's password (no library
// is known to do that, but a password in a log is not worth the risk), an
// error with that text masked and without the chain.
func safeErr(err error, rawURL string) error {
	u, perr := url.Parse(rawURL)
	if perr != nil {
		return errors.New("connection error (not shown: it may hold credentials)")
	}
	if p, ok := u.User.Password(); ok && p != "" && strings.Contains(err.Error(), p) {
		return errors.New(strings.ReplaceAll(err.Error(), p, "xxxxx"))
	}
	return err
}

func (l *link) set(c *amqp.Connection, w *batchConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.conn = c
	l.w = w
	l.downErr = nil
	if l == l.b.pub {
		l.b.frameMax.Store(int64(c.Config.FrameSize))
	}
	close(l.up)
}

// down records why the connection is down (see Broker.ConnectionError).
func (l *link) down(err error) {
	l.mu.Lock()
	l.downErr = err
	l.mu.Unlock()
}

func (l *link) unset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		l.conn, l.w = nil, nil
		l.up = make(chan struct{})
	}
}

// get returns the live connection, waiting for a reconnection bounded by
// ctx and Options.UnavailableAfter.
func (l *link) get(ctx context.Context) (*amqp.Connection, error) {
	c, _, err := l.getWriter(ctx)
	return c, err
}

// getWriter is get, also returning the connection's socket writer.
func (l *link) getWriter(ctx context.Context) (*amqp.Connection, *batchConn, error) {
	var timeout <-chan time.Time
	for {
		l.mu.Lock()
		c, w, up := l.conn, l.w, l.up
		l.mu.Unlock()
		if c != nil && !c.IsClosed() {
			return c, w, nil
		}
		if c != nil { // closed, the supervisor has not noticed yet
			up = nil
		}
		if timeout == nil {
			t := time.NewTimer(l.b.opts.UnavailableAfter)
			defer t.Stop()
			timeout = t.C
		}
		var poll <-chan time.Time
		if up == nil {
			poll = time.After(10 * time.Millisecond)
		}
		select {
		case <-up:
		case <-poll:
		case <-l.b.done:
			return nil, nil, sdk.ErrClosed
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%w: rabbitmq: %s connection down: %w", sdk.ErrUnavailable, l.name, ctx.Err())
		case <-timeout:
			return nil, nil, fmt.Errorf("%w: rabbitmq: %s connection down for %s", sdk.ErrUnavailable, l.name, l.b.opts.UnavailableAfter)
		}
	}
}

// supervise watches the connection and reconnects when it dies.
func (l *link) supervise(conn *amqp.Connection) {
	defer l.b.wg.Done()
	log := l.b.opts.Logger.With("broker", "rabbitmq", "connection", l.name, "url", l.b.redacted)
	var writer *batchConn
	for {
		lost := conn.NotifyClose(make(chan *amqp.Error, 1))
		select {
		case <-l.b.done:
			l.unset()
			// Bounded: on a frozen connection Close would wait for a
			// close-ok until the heartbeat gave up.
			_ = conn.CloseDeadline(time.Now().Add(l.b.opts.CloseTimeout))
			return
		case err := <-lost:
			l.unset()
			if err != nil {
				log.Warn("rabbitmq connection lost", "code", err.Code, "reason", err.Reason)
				l.down(fmt.Errorf("connection lost: %w", err))
			} else {
				log.Warn("rabbitmq connection lost")
				l.down(errors.New("connection lost"))
			}
		}
		l.b.forgetDeclared()
		for attempt := 1; ; attempt++ {
			if !l.b.sleep(l.b.backoff(attempt)) {
				return
			}
			ctx, cancel := context.WithTimeout(l.b.ctx, 30*time.Second)
			c, w, err := l.dial(ctx)
			cancel()
			if err == nil {
				conn, writer = c, w
				break
			}
			log.Warn("rabbitmq reconnect failed", "attempt", attempt, "err", err)
			l.down(err)
		}
		log.Info("rabbitmq reconnected")
		l.set(conn, writer)
	}
}
