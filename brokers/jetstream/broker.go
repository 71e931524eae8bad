package jetstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/sdk"
)

// Defaults of [Options].
const (
	DefaultAckWait       = 30 * time.Second
	DefaultWaitTime      = 7 * time.Second // does not divide DefaultAckWait: see the package doc
	DefaultMaxDeliveries = 10
	DefaultMaxInFlight   = 1024
	DefaultPrefix        = "berth"
	// DefaultDuplicates is the window in which JetStream drops a second
	// publish with the same Nats-Msg-Id.
	DefaultDuplicates = 2 * time.Minute
)

// Options configures a [Broker]. The zero value is usable.
type Options struct {
	// AckWait is the lease of every delivery: JetStream redelivers a
	// message not acknowledged within it. ExtendLease (InProgress) restarts
	// it. Default 30 s. Set WorkerOptions.Lease to at most this.
	//
	// It is the ready consumer's AckWait, which the queue's Brokers share:
	// declaring a queue lengthens the consumer's to this one but never
	// shortens it, since a Broker still receiving with a longer one counts
	// its leases by it. A Broker with a shorter one counts its own, shorter
	// leases (safe; a crashed holder's message comes back after the
	// consumer's AckWait). To lower it, edit the consumer (nats consumer
	// edit) once no Broker uses the longer one.
	AckWait time.Duration
	// WaitTime is how long one Receive long-polls an empty queue before it
	// returns no deliveries. Default 7 s. Choose one that does not divide
	// AckWait (see the package doc).
	WaitTime time.Duration
	// MaxDeliveries is the poison cap: a message delivered more than this
	// many times (retries and expired leases alike) is moved to the
	// dead-letter stream with the cause [sdk.ErrMaxDeliveries] when it is
	// received once more. Keep it above the Worker's MaxAttempts. Default 10.
	MaxDeliveries int
	// MaxMessageSize is the largest message, as [sdk.Message.Size] counts
	// it, that Publish accepts. Default: the server's max_payload less 16 KiB
	// for the headers berth adds. Whatever it is, Publish also refuses a
	// message whose NATS form (headers and body) leaves less than a few
	// hundred bytes of max_payload for the copies berth stores of it (a
	// dead letter, a release, a redrive).
	MaxMessageSize int
	// MaxInFlight bounds the asynchronous publishes awaiting their ack from
	// JetStream, across all Publish and PublishAsync calls of the Broker
	// (and its own copies: dead letters, moves). A message counts until its
	// ack, error or ack timeout (5 s) arrives, also when the call that sent
	// it returned first (its ctx ended). Default 1024.
	MaxInFlight int
	// Prefix names berth's streams (upper-cased) and subjects. Default
	// "berth": queue "billing" lives in stream BERTH_Q_billing on subjects
	// berth.q.billing (ready) and berth.d.billing (delayed), its dead letters
	// in stream BERTH_DLQ_billing. Letters, digits, '-' and '_' only.
	Prefix string
	// Duplicates is the stream's deduplication window (Nats-Msg-Id). Default
	// 2 min. Declaring a queue lengthens its streams' windows to this one but
	// never shortens them (another Broker of the queue may count on a longer
	// one); to shorten one, edit the stream. A window shorter than twice
	// the delay mover's lease (its consumer's AckWait, 1 min) is raised to
	// it: the mover acknowledges a move without waiting for the answer, and
	// a move redelivered after a lost ack must still fall within the window
	// of the first, or the delayed job is stored twice.
	Duplicates time.Duration
	// Storage is where streams keep messages. Default jetstream.FileStorage.
	Storage jetstream.StorageType
	// Replicas of each stream in a cluster. Default 1.
	Replicas int
	// AsyncAck sends settlements (ack, nak, in progress) without waiting
	// for JetStream's answer: faster when one goroutine acks messages one
	// after another, but a settlement written just before the connection
	// drops is lost and its message comes back although the call returned
	// nil (the conformance suite's ConnectionLoss case fails with it).
	// Default false: every settlement waits for the server.
	AsyncAck bool
	// NoDeclare stops Publish and Receive from declaring a queue on first
	// use: a queue whose stream does not exist is then an error wrapping
	// [sdk.ErrNotFound] and JetStream's own error. Declare queues with
	// DeclareQueue (or the nats CLI) instead.
	NoDeclare bool
	// Logger receives reconnects, disconnects and failures of background
	// work. Default slog.Default().
	Logger *slog.Logger
}

func (o Options) withDefaults(maxPayload int64) (Options, error) {
	if o.AckWait < 0 || o.WaitTime < 0 || o.MaxDeliveries < 0 || o.MaxMessageSize < 0 || o.MaxInFlight < 0 || o.Duplicates < 0 || o.Replicas < 0 {
		return o, fmt.Errorf("berth/jetstream: negative option in %+v", o)
	}
	if o.AckWait == 0 {
		o.AckWait = DefaultAckWait
	}
	if o.AckWait < 100*time.Millisecond {
		return o, fmt.Errorf("berth/jetstream: AckWait %s below 100ms", o.AckWait)
	}
	if o.WaitTime == 0 {
		o.WaitTime = DefaultWaitTime
	}
	if o.MaxDeliveries == 0 {
		o.MaxDeliveries = DefaultMaxDeliveries
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.Duplicates == 0 {
		o.Duplicates = DefaultDuplicates
	}
	o.Duplicates = max(o.Duplicates, 2*delayAckWait) // see Options.Duplicates
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	for i := 0; i < len(o.Prefix); i++ {
		c := o.Prefix[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return o, fmt.Errorf("berth/jetstream: Prefix %q: only letters, digits, '-' and '_'", o.Prefix)
		}
	}
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = int(maxPayload) - headerReserve
	}
	if o.MaxMessageSize <= 0 || int64(o.MaxMessageSize) > maxPayload {
		return o, fmt.Errorf("berth/jetstream: MaxMessageSize %d outside (0, server max_payload %d]", o.MaxMessageSize, maxPayload)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// headerReserve is what the default MaxMessageSize leaves of the server's
// max_payload for the NATS headers berth writes.
const headerReserve = 16 << 10

// ConnectOptions are the connection settings of [Connect].
type ConnectOptions struct {
	// TLS, when set, is the client TLS configuration (server verification,
	// client certificates). A tls:// URL with a nil TLS uses the system roots.
	TLS *tls.Config
	// CredentialsFile is a NATS .creds file (user JWT and NKey seed).
	CredentialsFile string
	// NKeyFile is an NKey seed file for NKey authentication.
	NKeyFile string
	// User and Password, or Token, authenticate when the URL carries none.
	User, Password, Token string
	// Name is the connection's name in the server's monitoring. Default "berth".
	Name string
	// ReconnectWait is the pause between reconnect attempts. Default 1 s.
	// The connection reconnects for ever; a Broker's calls made while it is
	// down wait (publishes are buffered by nats.go) or fail with
	// [sdk.ErrUnavailable].
	ReconnectWait time.Duration
	// Extra nats.go options, applied last.
	Extra []nats.Option
}

// Connect dials url (nats://, tls://; several separated by commas) and
// returns a Broker that owns the connection: Close closes it. The connection
// reconnects for ever and logs disconnects and reconnects on opts.Logger.
//
// ctx bounds the first connect only: its dials and handshakes end at ctx's
// deadline (each at the connection's Timeout when ctx has none) or when ctx
// is cancelled. Each later reconnect's dial and handshake is bounded by the
// connection's Timeout: nats.go's default (2 s), or nats.Timeout in
// co.Extra. With a custom dialer in co.Extra (nats.SetCustomDialer), that
// dialer and the Timeout bound the first connect too, not ctx.
func Connect(ctx context.Context, url string, co ConnectOptions, opts Options) (*Broker, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	name := co.Name
	if name == "" {
		name = "berth"
	}
	wait := co.ReconnectWait
	if wait <= 0 {
		wait = time.Second
	}
	nopts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(wait),
		nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: closed on purpose
				logger.Warn("berth/jetstream: disconnected", "err", err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			logger.Warn("berth/jetstream: connection error", "err", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			logger.Info("berth/jetstream: reconnected", "server", serverForLog(c.ConnectedUrl()))
		}),
	}
	if co.TLS != nil {
		nopts = append(nopts, nats.Secure(co.TLS))
	}
	if co.CredentialsFile != "" {
		nopts = append(nopts, nats.UserCredentials(co.CredentialsFile))
	}
	if co.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(co.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("berth/jetstream: nkey: %w", err)
		}
		nopts = append(nopts, o)
	}
	if co.User != "" {
		nopts = append(nopts, nats.UserInfo(co.User, co.Password))
	}
	if co.Token != "" {
		nopts = append(nopts, nats.Token(co.Token))
	}
	nopts = append(nopts, co.Extra...)
	dialer := &connectDialer{ctx: ctx}
	nopts = append(nopts, dialer.option)
	nc, err := nats.Connect(url, nopts...)
	if dialer.done() && err == nil {
		// ctx ended as the connect completed: its handshake deadline
		// may have been cut on the connection now open.
		nc.Close()
		err = ctx.Err()
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("berth/jetstream: connect: %w: %w", sdk.ErrUnavailable, context.Cause(ctx))
		}
		return nil, fmt.Errorf("berth/jetstream: connect: %w: %w", sdk.ErrUnavailable, err)
	}
	b, err := New(nc, opts)
	if err != nil {
		nc.Close()
		return nil, err
	}
	b.ownsConn = true
	return b, nil
}

// connectDialer dials the servers of Connect's connection. Until done, it
// dials under Connect's ctx, and each connection it opens takes ctx's
// deadline for its handshake in place of the connection's Timeout (nats.go
// sets that with SetDeadline) and has it cut short when ctx is cancelled.
// After done, for the reconnects, it dials as nats.go's own dialer does,
// with the connection's Timeout, and the handshake keeps it too. Before,
// Connect made its ctx's time left the connection's Timeout: a short one
// failed every later reconnect's handshake, a long one held nats.go's
// connection lock (every call on the connection) through a reconnect to a
// silent server for all of it.
type connectDialer struct {
	ctx  context.Context // Connect's
	base net.Dialer      // set by option

	mu    sync.Mutex
	ended bool          // done was called: the first connect is over
	stops []func() bool // of the cancellations armed on the connections the first connect opened
}

// option installs d as the connection's dialer, unless the application
// set one of its own (or an in-process server) in ConnectOptions.Extra.
// It runs after every other option, so it sees their Timeout and Dialer.
func (d *connectDialer) option(o *nats.Options) error {
	if o.CustomDialer != nil || o.InProcessServer != nil {
		return nil
	}
	if o.Dialer != nil {
		d.base = *o.Dialer
	} else {
		d.base = net.Dialer{Timeout: o.Timeout}
		if o.Timeout == 0 {
			d.base.Timeout = nats.DefaultTimeout
		}
	}
	if o.AllowMultipathTCP != nil {
		d.base.SetMultipathTCP(*o.AllowMultipathTCP)
	}
	o.CustomDialer = d
	return nil
}

// Dial implements nats.CustomDialer; nats.go calls it holding the
// connection's lock, one dial at a time.
func (d *connectDialer) Dial(network, address string) (net.Conn, error) {
	d.mu.Lock()
	first := !d.ended
	d.mu.Unlock()
	if !first {
		return d.base.Dial(network, address)
	}
	dialer := d.base
	if _, ok := d.ctx.Deadline(); ok {
		dialer.Timeout = 0 // ctx's deadline bounds it
	}
	c, err := dialer.DialContext(d.ctx, network, address)
	if err != nil {
		return nil, err
	}
	fc := &firstConnectConn{Conn: c, d: d}
	stop := context.AfterFunc(d.ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) }) // cancelled: the handshake's reads fail now
	d.mu.Lock()
	d.stops = append(d.stops, stop)
	d.mu.Unlock()
	return fc, nil
}

// done ends the first connect: later dials and handshakes keep the
// connection's Timeout. It reports whether a cancellation of ctx cut the
// deadline of a connection the first connect opened (perhaps the one now
// open).
func (d *connectDialer) done() (cut bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ended = true
	for _, stop := range d.stops {
		if !stop() {
			cut = true
		}
	}
	d.stops = nil
	return cut
}

// handshaking reports whether the first connect is under way.
func (d *connectDialer) handshaking() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.ended
}

// firstConnectConn is a connection the first connect opened: while that
// connect runs, the deadline nats.go sets for the handshake (now plus the
// connection's Timeout) is replaced by Connect's ctx's, when it has one.
// It stays the connection's until it is lost.
type firstConnectConn struct {
	net.Conn
	d *connectDialer
}

// SetDeadline implements net.Conn.
func (c *firstConnectConn) SetDeadline(t time.Time) error {
	return c.Conn.SetDeadline(c.deadline(t))
}

// SetReadDeadline implements net.Conn (nats.go's websocket handshake sets
// its deadline so).
func (c *firstConnectConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.deadline(t))
}

func (c *firstConnectConn) deadline(t time.Time) time.Time {
	if t.IsZero() || !c.d.handshaking() {
		return t
	}
	if c.d.ctx.Err() != nil {
		return time.Unix(1, 0) // as the cancellation set it
	}
	if dl, ok := c.d.ctx.Deadline(); ok {
		return dl
	}
	return t
}

// Broker is the berth broker on NATS JetStream. Its methods may be called
// concurrently.
type Broker struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	opts     Options
	ownsConn bool
	slots    chan struct{} // publish acks in flight

	declared sync.Map // queue name -> *queueState

	closed    atomic.Bool
	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup // movers, drains and declarations
	mu        sync.Mutex     // guards subs
	subs      map[*nats.Subscription]struct{}
	movers    map[string]bool // guarded by mu: streams this Broker moves delayed messages of

	pendMu  sync.Mutex
	pending map[*nats.Msg]*sdk.PublishResult // guarded by pendMu: published messages (Publish's and PublishAsync's) awaiting their outcome

	// status is the connection's last nats.Status, kept by watchStatus
	// from nats.go's status events: ConnectionError reads it without
	// nc.Status, which waits for the connection's lock, held by nats.go
	// through a reconnect's dial and handshake (up to its Timeout).
	status     atomic.Int32
	statusCh   chan nats.Status
	statusDone chan struct{}
	// maxPayload is the server's max_payload, kept by watchStatus (read
	// at each connect) for the same reason: nc.MaxPayload waits for the
	// connection's lock too.
	maxPayload atomic.Int64

	// closeCtx is cancelled by Close, with closing: it cuts short the
	// declarations under way (see declare).
	closeCtx    context.Context
	closeCancel context.CancelFunc
}

// New returns a Broker on the application's connection nc, which must have
// JetStream enabled. Close does not close nc.
func New(nc *nats.Conn, opts Options) (*Broker, error) {
	if nc == nil {
		return nil, errors.New("berth/jetstream: nil connection")
	}
	o, err := opts.withDefaults(nc.MaxPayload())
	if err != nil {
		return nil, err
	}
	b := &Broker{
		nc:      nc,
		opts:    o,
		slots:   make(chan struct{}, o.MaxInFlight),
		closing: make(chan struct{}),
		subs:    map[*nats.Subscription]struct{}{},
		pending: map[*nats.Msg]*sdk.PublishResult{},
	}
	b.closeCtx, b.closeCancel = context.WithCancel(context.Background())
	b.js, err = jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(o.MaxInFlight*4),
		// A publish whose ack was lost with the connection fails after
		// this long (wrapping sdk.ErrUnavailable); retrying it is safe.
		jetstream.WithPublishAsyncTimeout(publishAckTimeout),
		// PublishAsync's results resolve in these callbacks, on nats.go's
		// reply goroutine: no goroutine of berth's and no channels per
		// message between the ack and the result.
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, w *nats.Msg, _ *jetstream.PubAck) { b.asyncDone(w, nil) }),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, w *nats.Msg, err error) { b.asyncDone(w, err) }),
	)
	if err != nil {
		return nil, fmt.Errorf("berth/jetstream: %w", err)
	}
	b.watchStatus()
	return b, nil
}

// statusRefresh is how often watchStatus reads the connection's status
// itself: nats.go drops a status event when the listener's buffer is full,
// and the status kept would stay stale until the next change.
const statusRefresh = 5 * time.Second

// watchStatus keeps b.status up to date with the connection's status
// events until the connection closes or Close removes the listener. Events
// come in order, so the last one stored is the connection's status; every
// statusRefresh the status is read again (in this goroutine, which may wait
// for the connection's lock; a probe never does).
func (b *Broker) watchStatus() {
	b.statusCh = b.nc.StatusChanged(nats.DISCONNECTED, nats.CONNECTED, nats.CLOSED, nats.RECONNECTING,
		nats.CONNECTING, nats.DRAINING_SUBS, nats.DRAINING_PUBS)
	b.maxPayload.Store(b.nc.MaxPayload())
	b.status.Store(int32(b.nc.Status())) // after registering: no change is missed
	b.statusDone = make(chan struct{})
	go func() {
		defer close(b.statusDone)
		tick := time.NewTicker(statusRefresh)
		defer tick.Stop()
		for {
			var s nats.Status
			select {
			case ev, ok := <-b.statusCh:
				if !ok {
					return // Close removed the listener
				}
				s = ev
			case <-tick.C:
				s = b.nc.Status()
			}
			if s == nats.CONNECTED {
				// Another server may have another max_payload; stored
				// first, so that a call that finds the connection up
				// finds its server's.
				if mp := b.nc.MaxPayload(); mp > 0 {
					b.maxPayload.Store(mp)
				}
			}
			b.status.Store(int32(s))
			if s == nats.CLOSED {
				return // final: also when the application closes its nc without Close
			}
		}
	}()
}

// payloadLimit returns the server's max_payload (see maxPayload).
func (b *Broker) payloadLimit() int { return int(b.maxPayload.Load()) }

// Options returns the broker's options with defaults filled in.
func (b *Broker) Options() Options { return b.opts }

var (
	_ sdk.DeliveryCapReporter = (*Broker)(nil)
	_ sdk.LeaseReporter       = (*Broker)(nil)
	_ sdk.ConnectionReporter  = (*Broker)(nil)
)

// Lease returns [Options.AckWait], the lease of every delivery, as
// [sdk.LeaseReporter]: a Worker on this broker takes it as its default
// Lease, so its heartbeat (a third of it) comes before the server redelivers,
// whatever AckWait is.
func (b *Broker) Lease() time.Duration { return b.opts.AckWait }

// MaxDeliveries returns [Options.MaxDeliveries], the poison cap, as
// [sdk.DeliveryCapReporter]: a Worker whose MaxAttempts is above it is warned
// about (or refused), and dead-letters at it itself so the dead letter keeps
// the handler's error.
func (b *Broker) MaxDeliveries() int { return b.opts.MaxDeliveries }

// Conn returns the broker's NATS connection (for what berth does not cover).
func (b *Broker) Conn() *nats.Conn { return b.nc }

// publishAckTimeout is how long an asynchronous publish waits for its ack
// before it fails (wrapping sdk.ErrUnavailable).
const publishAckTimeout = 5 * time.Second

// Close stops the broker's background work (delay movers, drains of
// cancelled receives), ends the Receive calls under way (they return
// [sdk.ErrClosed]) and gives back, without consuming an attempt, what
// their pulls had read (see [Broker.Receive]), flushes settlements already
// sent, waits for the acks
// of publishes already sent (at most their 5 s ack timeout, so that a
// PublishAsync result gets its real outcome rather than ErrClosed) and
// closes the connection when the Broker owns it ([Connect]). Deliveries not
// settled come back after their AckWait. Close twice is safe.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock() // goOwned, enter and track check closed under mu
		b.closed.Store(true)
		b.mu.Unlock()
		close(b.closing)
		b.closeCancel()
		// Every pull runs in a Receive or a goroutine of the Broker's,
		// which wg counts: at closing, each drains its subscription,
		// reading what the server sent it (see unsubscribe), and gives
		// it back.
		b.wg.Wait()
		b.mu.Lock()
		subs := b.subs
		b.subs = map[*nats.Subscription]struct{}{}
		b.mu.Unlock()
		for s := range subs { // none left, unless a pull was not counted
			_ = s.Unsubscribe()
		}
		if !b.nc.IsClosed() {
			_ = b.nc.FlushTimeout(2 * time.Second)
			// The acks of what was published are on their way: each result
			// is resolved by its own ack (or its timeout), not failed
			// ErrClosed while the message is stored. Not nats.go's
			// PublishAsyncComplete: it can report done between taking an
			// ack and running the callback that resolves its result.
			b.awaitPending(publishAckTimeout + time.Second)
		}
		b.failPending()
		if b.ownsConn {
			b.nc.Close()
		}
		if b.statusCh != nil {
			b.nc.RemoveStatusListener(b.statusCh) // closes it: watchStatus ends
			<-b.statusDone
		}
	})
	return nil
}

// awaitPending waits, at most d, until every publish awaiting its ack has
// been resolved by its callback (asyncDone).
func (b *Broker) awaitPending(d time.Duration) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		b.pendMu.Lock()
		n := len(b.pending)
		b.pendMu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return
		}
	}
}

// flushTimeout bounds a Flush whose ctx has no deadline.
const flushTimeout = 30 * time.Second

// Flush waits until the server has received everything sent so far on the
// connection (settlements and the lease renewals of ExtendLease's timer
// already wait for their answer). The Worker calls it when it drains. A ctx
// without a deadline is given one of 30 s.
func (b *Broker) Flush(ctx context.Context) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if _, ok := ctx.Deadline(); !ok { // nats.go refuses a context without one
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, flushTimeout)
		defer cancel()
	}
	if err := b.nc.FlushWithContext(ctx); err != nil {
		return b.wrapErr(ctx, "flush", err)
	}
	return nil
}

// track registers s so that Close unsubscribes it; it returns false after
// Close.
func (b *Broker) track(s *nats.Subscription) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return false
	}
	b.subs[s] = struct{}{}
	return true
}

func (b *Broker) untrack(s *nats.Subscription) {
	b.mu.Lock()
	delete(b.subs, s)
	b.mu.Unlock()
	_ = s.Unsubscribe()
}

// enter registers a call that Close waits for (a Receive, a declaration;
// the caller calls b.wg.Done when it returns); it returns false after
// Close.
func (b *Broker) enter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return false
	}
	b.wg.Add(1)
	return true
}

// goOwned runs fn on a goroutine that Close waits for; it returns false
// (and does not run fn) after Close.
func (b *Broker) goOwned(fn func()) bool {
	if !b.enter() {
		return false
	}
	go func() {
		defer b.wg.Done()
		fn()
	}()
	return true
}

// errNotConnected reports a call made while the connection is down (nats.go
// reconnecting): it is refused rather than buffered, so that the caller
// knows it did not reach the server.
var errNotConnected = errors.New("not connected to the NATS server")

// ConnectionError implements [sdk.ConnectionReporter]: nil while the NATS
// connection is up, else an error wrapping [sdk.ErrUnavailable] with its
// status (nats.go reconnects by itself); [sdk.ErrClosed] once the Broker is
// closed. It makes no call to the server.
//
// It does not wait for the connection's lock, which nats.go holds through
// a reconnect's dial and handshake (up to the connection's Timeout): a
// health probe answers at once while a reconnection hangs on a black-holed
// server.
func (b *Broker) ConnectionError() error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if s := nats.Status(b.status.Load()); s != nats.CONNECTED {
		return fmt.Errorf("berth/jetstream: connection: %w: %w (%s)", sdk.ErrUnavailable, errNotConnected, s)
	}
	return nil
}

// connected returns an error wrapping sdk.ErrUnavailable unless the
// connection is up. Like ConnectionError, it reads the status watchStatus
// keeps, not nc.Status, which waits for the connection's lock: a Publish,
// Receive or settlement made while a reconnect's handshake hangs is refused
// at once rather than held for the handshake's Timeout whatever its ctx.
// (The status is that of the last event: a call made in the instant
// between a connection's loss and its event goes on, and is bounded by
// nats.go as before.)
func (b *Broker) connected(op string) error {
	if s := nats.Status(b.status.Load()); s != nats.CONNECTED {
		if b.closed.Load() {
			return sdk.ErrClosed
		}
		return fmt.Errorf("berth/jetstream: %s: %w: %w (%s)", op, sdk.ErrUnavailable, errNotConnected, s)
	}
	return nil
}

// isNetErr reports a failure of the connection itself: nats.go returns
// the socket's error as it is when a write fails before it notices the
// connection is gone (a publish as the connection resets, say).
func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// wrapErr turns a nats.go error into berth's: context errors unwrapped,
// a closed broker ErrClosed, connection trouble ErrUnavailable. A publish
// refused because nats.go's reconnect buffer is full (or disabled, with
// nats.ReconnectBufSize(-1)) is connection trouble too: once reconnected
// the same publish goes through.
func (b *Broker) wrapErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ctx.Err())) {
		return ctx.Err()
	}
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrNoServers) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrDisconnected) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, errNotConnected) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) || isNetErr(err) {
		return fmt.Errorf("berth/jetstream: %s: %w: %w", op, sdk.ErrUnavailable, err)
	}
	if streamFull(err) {
		return fmt.Errorf("berth/jetstream: %s: the stream cannot store more now: %w: %w", op, sdk.ErrUnavailable, err)
	}
	return fmt.Errorf("berth/jetstream: %s: %w", op, err)
}

// streamFull reports whether err is the server refusing to store a message
// for want of room: a stream limit an operator set (MaxMsgs, MaxBytes,
// with berth's discard new), or the server's storage or memory exhausted.
// Consumers make room, so it is ErrUnavailable (try later), as a RabbitMQ
// queue's reject-publish nack is, not a refusal of the message itself.
func streamFull(err error) bool {
	var ae *jetstream.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode {
	case 10077, // JSStreamStoreFailedF: "maximum messages exceeded", "maximum bytes exceeded"
		10023, // JSInsufficientResourcesErr
		10028, // JSMemoryResourcesExceededErr
		10047: // JSStorageResourcesExceededErr
		return true
	}
	return false
}

// serverForLog is the URL of the server a connection reached, for a log
// line: scheme and host only. nats.go's ConnectedUrlRedacted hides a
// password but not a token given as the URL's user (nats://TOKEN@host),
// which it logged whole at every reconnection.
func serverForLog(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable server URL)"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host}).String()
}
