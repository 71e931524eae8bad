package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/berthq/berth/sdk"
)

// Status is a job's state in the ledger.
type Status string

// The statuses, in the order a job normally goes through them.
const (
	StatusEnqueued  Status = "enqueued"  // published, not yet started
	StatusRunning   Status = "running"   // an attempt started and has not settled
	StatusRetrying  Status = "retrying"  // an attempt failed; the next is due at NextAttemptAt
	StatusReleased  Status = "released"  // handed back without consuming an attempt (shutdown, RetryAfter; class settle_failed: the release call failed)
	StatusSucceeded Status = "succeeded" // acked
	StatusDead      Status = "dead"      // dead-lettered
	StatusRedriven  Status = "redriven"  // moved back from the dead-letter queue, not yet started
)

// Statuses lists every status, for validation and display.
var Statuses = []Status{StatusEnqueued, StatusRunning, StatusRetrying, StatusReleased, StatusSucceeded, StatusDead, StatusRedriven}

// Valid reports whether s is one of [Statuses].
func (s Status) Valid() bool {
	for _, v := range Statuses {
		if s == v {
			return true
		}
	}
	return false
}

// Rank orders the statuses of one delivery of an attempt: an event replaces
// a row of the same generation, attempt and start only with a rank at least
// as high (and, at equal rank, a time at least as late); of another
// delivery of the attempt, when it started later (see the package doc).
// Ranks 3 (succeeded, dead) are final for their attempt; rank 2 (retrying)
// ends a delivery.
func (s Status) Rank() int {
	switch s {
	case StatusEnqueued, StatusRedriven:
		return 0
	case StatusRunning, StatusReleased:
		return 1
	case StatusRetrying:
		return 2
	case StatusSucceeded, StatusDead:
		return 3
	}
	return -1
}

// Event is one thing that happened to a job, as the ledger records it. The
// feeds ([Ledger.Publisher], the Observer methods, [Ledger.DeadLetters])
// build them; a [Store] writes them. Zero fields are unknown: a store keeps
// what the row already holds for them.
type Event struct {
	// MessageID names the job's row: the message's ID, or an sdk.LongDelay
	// hop's first message's ([sdk.HeaderHopOf]).
	MessageID      string
	Queue          string
	Type           string
	IdempotencyKey string
	CorrelationID  string
	Status         Status
	// Generation counts redrives (the message's berth-redrive-count, as
	// [sdk.RedriveCount] reads it: 0 when it is not 1 to 9 digits): a
	// redriven job starts again at attempt 1 in a new generation.
	Generation int
	// Attempt is the delivery's attempt, 0 for enqueued and redriven. A
	// dead event at attempt 0 is a broker's dead letter that did not say
	// its attempt ([Ledger.SyncDeadLetters]): it ends the row's current
	// attempt of its generation, whatever its number, unless that attempt
	// already ended succeeded or dead, and it makes no row where there is
	// none (the janitor relies on that not to bring back purged jobs).
	Attempt int
	// At is when it happened; it orders the events of one delivery of equal
	// rank.
	At time.Time
	// StartedAt is the delivery's start, in running and settlements: the
	// same in every event of one delivery ([Ledger.Settled] takes the one
	// [Ledger.Start] recorded), it tells two deliveries of one attempt
	// apart, the later start being the newer. Zero is unknown.
	StartedAt     time.Time
	NextAttemptAt time.Time // retrying, released with a delay; enqueued: when a delayed message is due
	Error         string    // retrying, dead, released with a cause
	Class         sdk.ErrorClass
	Duration      time.Duration // handler run time, settlements
	Worker        string
	// RedriveAll, with Status redriven and no MessageID, marks every job of
	// Queue that was dead at At as redriven (a redrive of the whole queue).
	// [Ledger.DeadLetters] does not record it: a job dead in the ledger
	// whose dead letter was purged would be marked too.
	RedriveAll bool
}

// Store writes events. Write is called by one goroutine at a time (the
// ledger's writer; several at once with Options.Writers > 1) with a batch it must not retain; it applies every event
// whose (Generation, Attempt, StartedAt, rank, At) is newer than the row's, in any
// order, and leaves older ones out (see the package doc). An error means
// the batch may be partly written; the ledger counts it and moves on, so
// Write must not retry for long. Implementations: pgledger.Store.
type Store interface {
	Write(ctx context.Context, batch []Event) error
}

// Options configures a [Ledger]. Only Store is required.
type Options struct {
	// Store receives the batches. Required.
	Store Store
	// Buffer is how many events may wait to be written. Default 8192.
	Buffer int
	// BatchSize bounds the events of one Write. Default 512.
	BatchSize int
	// BlockTimeout is how long recording waits for room when the buffer is
	// full before dropping the event. Default 5ms; negative drops at once.
	// The wait is on the caller's goroutine: a Worker's handler starts (or
	// its next job begins) at most BlockTimeout later; a Publish through
	// [Ledger.Publisher] returns at most BlockTimeout later whatever the
	// size of its batch (its events share the wait: once it is spent, the
	// rest that find the buffer full are dropped and counted at once); no
	// job's outcome ever depends on it.
	BlockTimeout time.Duration
	// Linger is how long the writer waits for more events before writing a
	// batch that is not full. Events of one job that land in one batch
	// (a short job's start and settlement) are merged into one row write,
	// so a little lingering saves the database work under load. Default
	// 5ms; negative writes whatever is buffered at once.
	Linger time.Duration
	// Writers is how many batches may be written at once. Default 1. With
	// more, a batch is gathered while others are written, which shortens
	// the write lag when each Write waits on a busy database; the order in
	// which batches land does not matter (the store's guard orders events),
	// and pgledger.Store locks a batch's rows in one order, so concurrent
	// batches of job events cannot deadlock each other (a whole-queue
	// redrive racing them may; PostgreSQL then aborts one batch as the
	// deadlock's victim, which pgledger.Store.Write sends again, up to
	// three times in all, and only then reports failed like any other
	// failed batch). Store.Write is then called from several
	// goroutines at once and must be safe for that.
	Writers int
	// WriteTimeout bounds each Write, and Close's writing of what is
	// buffered as a whole. Default 10s.
	WriteTimeout time.Duration
	// WorkerID names this process in the rows it writes. Default
	// "hostname/pid".
	WorkerID string
	// MeterProvider creates the ledger's instruments. Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives the first failed write of a run of failures (then a
	// warning a minute while they go on, and the first write that succeeds
	// again) and the first drop of a run of drops. Default slog.Default().
	Logger *slog.Logger
}

// Defaults of [Options].
const (
	DefaultBuffer       = 8192
	DefaultBatchSize    = 512
	DefaultBlockTimeout = 5 * time.Millisecond
	DefaultLinger       = 5 * time.Millisecond
)

// ErrInvalidOptions reports a bad [Options].
var ErrInvalidOptions = errors.New("ledger: invalid options")

// ErrClosed is returned by Flush after Close. It is [sdk.ErrClosed].
var ErrClosed = sdk.ErrClosed

// Stats counts the ledger's events since New. Recorded = Written + Dropped
// + Failed + (events buffered or being written).
type Stats struct {
	Recorded int64 // events handed to the ledger
	Written  int64 // events in batches the store accepted
	Dropped  int64 // events dropped because the buffer stayed full, recorded after Close, or left when Close ran out of time
	Failed   int64 // events in batches the store refused
	Batches  int64 // Write calls that succeeded
	Buffered int   // events waiting now
	// MaxLag is the longest time a batch's oldest event waited between being
	// recorded and the batch being written, since New; MeanLag the mean over
	// batches.
	MaxLag, MeanLag time.Duration
}

// ScopeName is the instrumentation scope of the ledger's meter.
const ScopeName = "github.com/berthq/berth/ledger"

// Metric attribute key: written, dropped or failed.
const AttrResult = attribute.Key("berth.ledger.result")

// Ledger records job events and writes them to a [Store] in batches. It is
// an [sdk.Observer]; it is safe for concurrent use. Close stops its writer.
//
// Instruments:
//
//	berth.ledger.events          counter    {event}  per berth.ledger.result written|dropped|failed
//	berth.ledger.batches         counter    {batch}  batches written
//	berth.ledger.buffered        gauge      {event}  events waiting to be written
//	berth.ledger.lag             histogram  s        from record to written, per batch (its oldest event)
type Ledger struct {
	opts   Options
	worker string
	buf    chan pending
	flush  chan chan struct{}
	stop   chan struct{}
	done   chan struct{}
	closed atomic.Bool
	once   sync.Once
	// closeBy is when Close gives up writing what is buffered (unix
	// nanos; 0 before Close).
	closeBy atomic.Int64
	// With Writers > 1: run hands batches to the writer goroutines on work
	// and counts them in inflight until written.
	work     chan written
	inflight sync.WaitGroup
	writers  sync.WaitGroup

	recorded, written, dropped, failed, batches atomic.Int64
	maxLag, lagSum                              atomic.Int64
	dropping                                    atomic.Bool  // logged the current run of drops
	droppingClosed                              atomic.Bool  // logged a Record after Close
	closeDropped                                atomic.Int64 // events dropped because Close ran out of time
	fails                                       failLog

	lag  metric.Float64Histogram
	regs metric.Registration
}

// written is a batch handed to a writer goroutine.
type written struct {
	batch  []Event
	oldest int64
}

type pending struct {
	e  Event
	at int64 // unix nanos when recorded
}

var _ sdk.Observer = (*Ledger)(nil)

// New starts a ledger writing to opts.Store. Close it to write what is
// buffered and stop its goroutine.
func New(opts Options) (*Ledger, error) {
	if opts.Store == nil {
		return nil, fmt.Errorf("%w: nil Store", ErrInvalidOptions)
	}
	if opts.Buffer < 0 || opts.BatchSize < 0 || opts.WriteTimeout < 0 || opts.Writers < 0 {
		return nil, fmt.Errorf("%w: negative Buffer, BatchSize, Writers or WriteTimeout", ErrInvalidOptions)
	}
	if opts.Writers == 0 {
		opts.Writers = 1
	}
	if opts.Buffer == 0 {
		opts.Buffer = DefaultBuffer
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.BlockTimeout == 0 {
		opts.BlockTimeout = DefaultBlockTimeout
	}
	if opts.Linger == 0 {
		opts.Linger = DefaultLinger
	}
	if opts.WriteTimeout == 0 {
		opts.WriteTimeout = 10 * time.Second
	}
	if opts.WorkerID == "" {
		host, _ := os.Hostname()
		opts.WorkerID = host + "/" + strconv.Itoa(os.Getpid())
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = otel.GetMeterProvider()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	l := &Ledger{
		opts: opts, worker: opts.WorkerID,
		buf:   make(chan pending, opts.Buffer),
		flush: make(chan chan struct{}),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	if err := l.instruments(); err != nil {
		return nil, err
	}
	if opts.Writers > 1 {
		l.work = make(chan written)
		l.writers.Add(opts.Writers)
		for range opts.Writers {
			go l.writer()
		}
	}
	go l.run()
	return l, nil
}

func (l *Ledger) instruments() error {
	m := l.opts.MeterProvider.Meter(ScopeName)
	events, err := m.Int64ObservableCounter("berth.ledger.events", metric.WithUnit("{event}"),
		metric.WithDescription("Ledger events, per berth.ledger.result written|dropped|failed."))
	if err != nil {
		return err
	}
	batches, err := m.Int64ObservableCounter("berth.ledger.batches", metric.WithUnit("{batch}"),
		metric.WithDescription("Ledger batches written."))
	if err != nil {
		return err
	}
	buffered, err := m.Int64ObservableGauge("berth.ledger.buffered", metric.WithUnit("{event}"),
		metric.WithDescription("Ledger events waiting to be written."))
	if err != nil {
		return err
	}
	l.lag, err = m.Float64Histogram("berth.ledger.lag", metric.WithUnit("s"),
		metric.WithDescription("Time from recording a ledger event to writing its batch (the batch's oldest event)."),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	if err != nil {
		return err
	}
	written := metric.WithAttributeSet(attribute.NewSet(AttrResult.String("written")))
	dropped := metric.WithAttributeSet(attribute.NewSet(AttrResult.String("dropped")))
	failed := metric.WithAttributeSet(attribute.NewSet(AttrResult.String("failed")))
	l.regs, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(events, l.written.Load(), written)
		o.ObserveInt64(events, l.dropped.Load(), dropped)
		o.ObserveInt64(events, l.failed.Load(), failed)
		o.ObserveInt64(batches, l.batches.Load())
		o.ObserveInt64(buffered, int64(len(l.buf)))
		return nil
	}, events, batches, buffered)
	return err
}

// WorkerID is the name this ledger writes in the rows of the attempts it
// runs.
func (l *Ledger) WorkerID() string { return l.worker }

// Stats returns the ledger's counters.
func (l *Ledger) Stats() Stats {
	s := Stats{
		Recorded: l.recorded.Load(), Written: l.written.Load(), Dropped: l.dropped.Load(),
		Failed: l.failed.Load(), Batches: l.batches.Load(), Buffered: len(l.buf),
		MaxLag: time.Duration(l.maxLag.Load()),
	}
	if b := s.Batches; b > 0 {
		s.MeanLag = time.Duration(l.lagSum.Load() / b)
	}
	return s
}

// Record hands e to the writer. It never fails: when the buffer stays full
// for Options.BlockTimeout the event is dropped and counted; after Close it
// is dropped too, at once. A Record racing Close is written or dropped,
// and counted either way. The feeds call it; applications may record
// events of their own (a custom publisher).
func (l *Ledger) Record(e Event) {
	var by time.Time
	l.record(e, &by)
}

// record is Record with the wait for room shared: by, when not nil, is
// when the caller stops waiting for a full buffer, set from BlockTimeout
// by the first of its events that finds the buffer full (zero before), so
// that the events of one call (a Publish of a batch) wait BlockTimeout in
// all, not each. by nil drops the event at once when the buffer is full,
// whatever BlockTimeout says (a caller that must not block: a broker's
// confirmation callback).
func (l *Ledger) record(e Event, by *time.Time) {
	l.recorded.Add(1)
	if l.closed.Load() {
		l.dropClosed(e)
		return
	}
	p := pending{e: e, at: time.Now().UnixNano()}
	select {
	case l.buf <- p:
		l.sent()
		return
	default:
	}
	if by != nil && l.opts.BlockTimeout > 0 {
		if by.IsZero() {
			*by = time.Now().Add(l.opts.BlockTimeout)
		}
		if wait := time.Until(*by); wait > 0 {
			t := time.NewTimer(wait)
			defer t.Stop()
			select {
			case l.buf <- p:
				l.sent()
				return
			case <-t.C:
			case <-l.stop:
			}
		}
	}
	l.drop(e)
}

// sent follows every event put in the buffer. A Record that passed the
// closed check before Close may put its event in after the writer's last
// drain; the writer has then stopped (done is closed), so that event
// would stay buffered, neither written nor dropped. Close drains the
// buffer after the writer stops, and so does a Record that finds the
// writer stopped after its send: an event sent before done closed is
// there for Close's drain, one sent after is there for its sender's. Each
// event is received once, so it is counted once. Before Close this costs
// a non-blocking receive on an open channel: two loads, no lock.
func (l *Ledger) sent() {
	select {
	case <-l.done:
		l.reclaim()
	default:
	}
}

// reclaim counts as dropped the events left in the buffer once the writer
// has stopped. Close and late Records may run it at once.
func (l *Ledger) reclaim() {
	for {
		select {
		case <-l.buf:
			l.dropped.Add(1)
		default:
			return
		}
	}
}

// dropClosed counts an event recorded after Close as dropped, and says so
// once: not "buffer full", which would send an operator after a writer that
// is not behind but stopped.
func (l *Ledger) dropClosed(e Event) {
	l.dropped.Add(1)
	if l.droppingClosed.CompareAndSwap(false, true) {
		l.opts.Logger.Warn("berth/ledger: event recorded after Close; dropped (a feed still runs after the ledger was closed: close the Worker or publisher first)",
			sdk.LogText("id", e.MessageID), "status", string(e.Status))
	}
}

func (l *Ledger) drop(e Event) {
	l.dropped.Add(1)
	if l.dropping.CompareAndSwap(false, true) {
		l.opts.Logger.Warn("berth/ledger: buffer full; dropping events until the writer catches up",
			"buffer", l.opts.Buffer, sdk.LogText("id", e.MessageID), "status", string(e.Status))
	}
}

// Flush waits until every event recorded before it is written (or failed),
// or ctx is done. After Close it returns [ErrClosed].
func (l *Ledger) Flush(ctx context.Context) error {
	if l.closed.Load() {
		return ErrClosed
	}
	ack := make(chan struct{})
	select {
	case l.flush <- ack:
	case <-l.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close writes what is buffered, stops the writer and unregisters the
// metrics callback. It spends at most WriteTimeout writing the buffer
// (after a batch being written when it is called, itself bounded by
// WriteTimeout): with the database down or not answering, the batches
// left then are dropped and counted, rather than each waiting its own
// WriteTimeout and holding up the process's shutdown for minutes. Events
// recorded after Close are dropped and counted; so are those of Records
// racing it that reach the buffer after the writer's last drain. Calling
// it again returns nil.
func (l *Ledger) Close() error {
	var err error
	l.once.Do(func() {
		l.closeBy.Store(time.Now().Add(l.opts.WriteTimeout).UnixNano())
		l.closed.Store(true)
		close(l.stop)
		<-l.done
		if n := l.closeDropped.Load(); n > 0 {
			// Said once, with every event it dropped: a count per batch
			// would tell an operator a fraction of what was lost.
			l.opts.Logger.Warn("berth/ledger: Close ran out of time (WriteTimeout) writing the buffer; dropped the events left",
				"events", n)
		}
		l.reclaim()
		err = l.regs.Unregister()
	})
	return err
}

// run is the writer: from the first event of a batch it gathers events for
// up to Linger or BatchSize, whichever comes first, and writes them; while
// a batch is written the next one gathers, so batches grow with the rate.
func (l *Ledger) run() {
	defer close(l.done)
	if l.work != nil {
		defer l.writers.Wait()
		defer close(l.work)
	}
	batch := make([]Event, 0, l.opts.BatchSize)
	oldest := int64(0)
	add := func(p pending) {
		if len(batch) == 0 || p.at < oldest {
			oldest = p.at
		}
		batch = append(batch, p.e)
	}
	gather := func() {
		for len(batch) < l.opts.BatchSize {
			select {
			case p := <-l.buf:
				add(p)
			default:
				return
			}
		}
	}
	drain := func() {
		for {
			gather()
			if len(batch) == 0 {
				return
			}
			batch = l.dispatch(batch, oldest)
		}
	}
	for {
		select {
		case p := <-l.buf:
			add(p)
			ack, stop := l.linger(&batch, add)
			batch = l.dispatch(batch, oldest)
			if ack != nil {
				drain()
				l.inflight.Wait()
				close(ack)
			}
			if stop {
				drain()
				return
			}
		case ack := <-l.flush:
			drain()
			l.inflight.Wait()
			close(ack)
		case <-l.stop:
			drain()
			return
		}
	}
}

// linger adds events to batch until it is full or Linger has passed since
// its first event. A flush or stop cuts it short: it returns the flush's
// ack, or stop true, for run to handle once the batch is written.
func (l *Ledger) linger(batch *[]Event, add func(pending)) (ack chan struct{}, stop bool) {
	var timeout <-chan time.Time
	if l.opts.Linger > 0 {
		t := time.NewTimer(l.opts.Linger)
		defer t.Stop()
		timeout = t.C
	}
	for len(*batch) < l.opts.BatchSize {
		select {
		case p := <-l.buf:
			add(p)
			continue
		default:
		}
		if timeout == nil {
			return nil, false
		}
		select {
		case p := <-l.buf:
			add(p)
		case <-timeout:
			return nil, false
		case ack := <-l.flush:
			return ack, false
		case <-l.stop:
			return nil, true
		}
	}
	return nil, false
}

// dispatch writes batch, or with several writers hands it to one (waiting
// for one to be free), and returns the slice to gather the next batch in.
func (l *Ledger) dispatch(batch []Event, oldest int64) []Event {
	if l.work == nil {
		l.write(batch, oldest)
		return batch[:0]
	}
	l.inflight.Add(1)
	l.work <- written{batch: batch, oldest: oldest}
	return make([]Event, 0, l.opts.BatchSize)
}

// writer is one of Options.Writers goroutines, owned by run: it stops when
// run closes work, and run returns after it.
func (l *Ledger) writer() {
	defer l.writers.Done()
	for w := range l.work {
		l.write(w.batch, w.oldest)
		l.inflight.Done()
	}
}

func (l *Ledger) write(batch []Event, oldest int64) {
	n := int64(len(batch))
	deadline := time.Now().Add(l.opts.WriteTimeout)
	if by := l.closeBy.Load(); by != 0 {
		if by <= time.Now().UnixNano() {
			// Close's time to write the buffer is up: Close logs the
			// count once the writer has stopped.
			l.dropped.Add(n)
			l.closeDropped.Add(n)
			return
		}
		if t := time.Unix(0, by); t.Before(deadline) {
			deadline = t
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	err := l.opts.Store.Write(ctx, batch)
	cancel()
	if err != nil {
		l.failed.Add(n)
		l.writeFailed(n, err)
		return
	}
	if l.fails.failing.Load() {
		l.writeRecovered()
	}
	lag := time.Now().UnixNano() - oldest
	l.written.Add(n)
	l.lagSum.Add(lag)
	l.batches.Add(1)
	for m := l.maxLag.Load(); lag > m && !l.maxLag.CompareAndSwap(m, lag); m = l.maxLag.Load() {
	}
	l.lag.Record(context.Background(), float64(lag)/1e9)
	if len(l.buf) < cap(l.buf)/2 {
		l.dropping.Store(false)
	}
}

// failLogEvery spaces the warnings of a run of failed writes.
const failLogEvery = time.Minute

// failLog is the logging state of a run of failed writes: while the
// database is down every batch fails, one every Linger or faster, and a
// warning each would flood the logs.
type failLog struct {
	failing  atomic.Bool // a run of failures is on (fast path of write)
	mu       sync.Mutex
	last     time.Time // when the run was last logged
	unlogged int64     // events failed since then
	lost     int64     // events failed in the run
}

// writeFailed logs the first failed write of a run, then at most one
// warning per failLogEvery with the events lost since the last.
func (l *Ledger) writeFailed(n int64, err error) {
	f := &l.fails
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lost += n
	now := time.Now()
	if !f.failing.Load() {
		f.failing.Store(true)
		f.last, f.unlogged = now, 0
		l.opts.Logger.Warn("berth/ledger: write failed; these events are lost (the jobs are not affected); further failures are logged once a minute until a write succeeds",
			"events", n, "err", err)
		return
	}
	f.unlogged += n
	if now.Sub(f.last) >= failLogEvery {
		l.opts.Logger.Warn("berth/ledger: writes still failing; these events are lost (the jobs are not affected)",
			"events", f.unlogged, "lost_in_run", f.lost, "err", err)
		f.last, f.unlogged = now, 0
	}
}

// writeRecovered ends a run of failed writes.
func (l *Ledger) writeRecovered() {
	f := &l.fails
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.failing.Load() {
		return
	}
	f.failing.Store(false)
	l.opts.Logger.Info("berth/ledger: writes succeed again", "lost_in_run", f.lost)
	f.lost, f.unlogged = 0, 0
}
