package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
)

// ErrInvalidSchema reports an Options.Schema that is not a safe identifier.
var ErrInvalidSchema = errors.New("berth/postgres: invalid schema name")

// ErrInvalidOptions reports Options that cannot work (a negative duration, a
// MaxAttempts below zero or above PostgreSQL's integer range, a WorkerID
// PostgreSQL text cannot hold).
var ErrInvalidOptions = errors.New("berth/postgres: invalid options")

// Defaults of [Options].
const (
	DefaultLease             = 30 * time.Second
	DefaultPollInterval      = time.Second
	DefaultMaxMessageSize    = 1 << 20
	DefaultRetentionInterval = time.Minute
	DefaultRetentionBatch    = 1000
)

// Options configures a [Broker]. The zero value is a sensible broker on the
// schema "berth".
type Options struct {
	// Schema holds the jobs table. Default "berth". Validated by
	// [ValidateSchema] and always quoted.
	Schema string
	// Lease is how long a claimed job stays with its worker before another
	// may claim it (visibility_until). Default 30s. The Worker's Lease should
	// match it.
	Lease time.Duration
	// MaxAttempts is written into max_attempts of every job published: a job
	// claimed that many times without being settled is dead-lettered at the
	// next claim with cause [sdk.ErrMaxDeliveries] (a poison job that kills
	// its workers). Default [sdk.DefaultMaxAttempts]. Keep it at least the
	// Worker's RetryPolicy.MaxAttempts: a Worker above it is warned about
	// (refused with StrictConfig) and dead-letters at this cap itself, with
	// the handler's error ([Broker.MaxDeliveries]). At most math.MaxInt32
	// (the column is a PostgreSQL integer).
	MaxAttempts int
	// WorkerID is written into worker_id of the rows this broker claims.
	// Default "<hostname>-<pid>-<random>". It must be valid UTF-8 without
	// NUL bytes (what PostgreSQL text holds): New refuses another with
	// [ErrInvalidOptions], as every claim would fail.
	WorkerID string
	// PollInterval bounds how long Receive waits before querying the table
	// again when no notification arrives (LISTEN/NOTIFY is the fast path;
	// delayed jobs and expired leases wake Receive at their due time: a
	// Receive sleeps until the earliest due time it saw, and a delayed
	// Publish, Retry or Release notifies, so a Receive already asleep
	// looks again and sleeps until the new earliest one). Default 1s.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY off: Receive polls only (for poolers
	// in transaction mode, which cannot LISTEN). Publish still notifies.
	DisableListen bool
	// DedupeEnqueue makes the IdempotencyKey of published messages unique per
	// queue: publishing a message whose key a job of that queue already has
	// (in any status, until retention deletes it) inserts nothing, and
	// Publish sets the message's ID to the existing job's; within one batch
	// the first message with a key wins, even among messages sharing an ID.
	// Messages without a key are unaffected. Default off: every publish is a new job and
	// duplicates are stopped by the idempotency middleware at consume time.
	DedupeEnqueue bool
	// Retention, when positive, runs a background loop owned by the broker
	// that deletes completed jobs older than Retention every
	// RetentionInterval, RetentionBatch rows per statement. Zero keeps
	// completed jobs (call [Broker.DeleteCompleted] yourself). The loop
	// stops at Close, or once the application has closed the pool.
	Retention time.Duration
	// RetentionInterval is the period of the retention loop. Default 1m.
	RetentionInterval time.Duration
	// RetentionBatch bounds each DELETE of the retention loop. Default 1000.
	RetentionBatch int
	// MaxMessageSize is the largest [sdk.Message.Size] Publish accepts.
	// Default 1 MiB; negative means no limit (PostgreSQL's own is 1 GB).
	MaxMessageSize int
	// Logger receives the broker's logs (listener reconnects, retention).
	// Default slog.Default().
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if err := ValidateSchema(o.Schema); err != nil {
		return o, err
	}
	if o.Lease < 0 || o.PollInterval < 0 || o.Retention < 0 || o.RetentionInterval < 0 ||
		o.RetentionBatch < 0 || o.MaxAttempts < 0 {
		return o, fmt.Errorf("%w: negative Lease, PollInterval, Retention, RetentionInterval, RetentionBatch or MaxAttempts", ErrInvalidOptions)
	}
	if o.MaxAttempts > math.MaxInt32 {
		// max_attempts is an integer column: every Publish would fail.
		return o, fmt.Errorf("%w: MaxAttempts %d above PostgreSQL's integer maximum %d", ErrInvalidOptions, o.MaxAttempts, math.MaxInt32)
	}
	if !sqlident.StorableText(o.WorkerID) {
		// worker_id is text: every claim would fail (SQLSTATE 22021).
		return o, fmt.Errorf("%w: WorkerID %q is not valid UTF-8 without NUL bytes", ErrInvalidOptions, o.WorkerID)
	}
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	if o.Lease < time.Millisecond {
		return o, fmt.Errorf("%w: Lease %s under 1ms", ErrInvalidOptions, o.Lease)
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = sdk.DefaultMaxAttempts
	}
	if o.WorkerID == "" {
		host, _ := os.Hostname()
		o.WorkerID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randomHex(4))
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.RetentionInterval == 0 {
		o.RetentionInterval = DefaultRetentionInterval
	}
	if o.RetentionBatch == 0 {
		o.RetentionBatch = DefaultRetentionBatch
	}
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = DefaultMaxMessageSize
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// Broker is a job queue on a PostgreSQL table. It implements [sdk.Broker],
// [sdk.QueueDeclarer], [sdk.Inspector] and [sdk.DeadLetters]; its deliveries
// implement [sdk.Releaser].
//
// All methods may be called concurrently. The broker does not own the pool:
// Close stops the broker's goroutines and its LISTEN connection, and the
// caller closes the pool after it.
type Broker struct {
	pool    *pgxpool.Pool
	opts    Options
	schema  string
	table   string // quoted schema.jobs
	channel string // NOTIFY channel

	closeOnce sync.Once
	closed    <-chan struct{}    // closed by Close
	life      context.Context    // done at Close (closed is its Done)
	stop      context.CancelFunc // cancels the context of the broker's goroutines
	wg        sync.WaitGroup     // the broker's goroutines: acker, listener, retention loop, claim recoveries
	ownMu     sync.Mutex         // orders goOwnedIfOpen's wg.Add before Close's wg.Wait

	// handBacks is the context of the hand-backs the broker runs in the
	// background (recoverLoop): done when Close has given them closeGrace
	// to finish, not at once, so that Close does not strand their rows.
	handBacks     context.Context
	stopHandBacks context.CancelFunc

	listenOnce sync.Once
	listenGo   chan struct{} // closed by the first Receive: the listener may connect
	wake       *waker
	acks       *acker

	// claimTimeout bounds a claim (and the hand-back of rows claimed for
	// a caller that left), which Receive's ctx does not cut; ackTimeout
	// bounds one flush of the acker, which no caller's ctx cuts. Both
	// are defaultInternalTimeout; tests shorten them (export_test.go).
	claimTimeout, ackTimeout time.Duration

	// now is the application host's clock (time.Now; a test sets one
	// ahead of the server's).
	now func() time.Time
}

// defaultInternalTimeout bounds the statements that run without a caller's
// context: a database that does not answer within it is reported as
// [sdk.ErrUnavailable].
const defaultInternalTimeout = 30 * time.Second

// defaultCloseGrace is the longest Close waits for the broker's background
// hand-backs (the rows of a claim whose reply was lost) to finish.
const defaultCloseGrace = 5 * time.Second

// closeGrace is how long Close lets background hand-backs run: at most
// defaultCloseGrace, and no longer than the claim limit.
func (b *Broker) closeGrace() time.Duration { return min(defaultCloseGrace, b.claimTimeout) }

// New returns a broker on pool. It does not touch the database: call
// [Broker.Migrate] (or apply [SchemaSQL]) before the first Publish.
func New(pool *pgxpool.Pool, opts Options) (*Broker, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidOptions)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	handBacks, stopHandBacks := context.WithCancel(context.Background())
	b := &Broker{
		pool:     pool,
		opts:     o,
		schema:   o.Schema,
		table:    quoteIdent(o.Schema) + ".jobs",
		channel:  o.Schema + ".jobs",
		closed:   ctx.Done(),
		life:     ctx,
		stop:     stop,
		listenGo: make(chan struct{}),
		wake:     newWaker(),

		handBacks:     handBacks,
		stopHandBacks: stopHandBacks,

		claimTimeout: defaultInternalTimeout,
		ackTimeout:   defaultInternalTimeout,
		now:          time.Now,
	}
	b.acks = newAcker(b)
	b.goOwned(func() { b.acks.run(ctx) })
	if !o.DisableListen {
		b.goOwned(func() { b.listen(ctx) })
	}
	if o.Retention > 0 {
		b.goOwned(func() { b.retentionLoop(ctx) })
	}
	return b, nil
}

// Close stops the broker: pending Receive calls return [sdk.ErrClosed], the
// LISTEN connection and the retention loop stop, acks already made are
// written, and every later call returns [sdk.ErrClosed]. The hand-back of a
// claim whose reply was lost (see [Broker.Receive]) that is under way is
// given up to 5 s (and no more than the claim limit) to finish before Close
// returns, so that the application may close the pool, or exit, after
// Close without stranding those rows; rows it cannot hand back in that
// time come back after their lease. Jobs received and not settled come
// back after their lease too: settle or release them (stop the Worker)
// before Close, since every settlement after it, Release included, is
// refused with [sdk.ErrClosed].
// Close is safe to call twice; it does not close the pool.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		b.ownMu.Lock()
		b.stop()
		b.ownMu.Unlock()
		// The acker, the listener and the retention loop stop at once;
		// background hand-backs get the grace, then are cut.
		grace := time.AfterFunc(b.closeGrace(), b.stopHandBacks)
		b.wg.Wait()
		grace.Stop()
		b.stopHandBacks()
	})
	return nil
}

// Schema returns the schema the broker's table lives in.
func (b *Broker) Schema() string { return b.schema }

// WorkerID returns the worker_id written on the rows this broker claims.
func (b *Broker) WorkerID() string { return b.opts.WorkerID }

func (b *Broker) isClosed() bool {
	select {
	case <-b.closed:
		return true
	default:
		return false
	}
}

// goOwned runs f on a goroutine that Close waits for.
func (b *Broker) goOwned(f func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
}

func randomHex(n int) string {
	p := make([]byte, n)
	_, _ = rand.Read(p)
	return hex.EncodeToString(p)
}

func errClosed(op string) error { return fmt.Errorf("berth/postgres: %s: %w", op, sdk.ErrClosed) }
