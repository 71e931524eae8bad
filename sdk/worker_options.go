package sdk

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"reflect"
	"time"
)

// RetryPolicy says how transient failures are retried.
type RetryPolicy struct {
	// MaxAttempts is the attempt at which a transient failure is dead-lettered
	// instead of retried. Zero means [DefaultMaxAttempts] (5); [NewWorker]
	// refuses a negative one ([ErrInvalidOptions]).
	MaxAttempts int
	// Backoff computes the delay before each retry. [NewWorker] refuses a
	// negative Base or Max ([ErrInvalidOptions]).
	Backoff Backoff
}

// validate refuses the negative values NewWorker would otherwise have taken
// for zero (the default); who names p in the error.
func (p RetryPolicy) validate(who string) error {
	switch {
	case p.MaxAttempts < 0:
		return fmt.Errorf("%w: negative %s.MaxAttempts %d", ErrInvalidOptions, who, p.MaxAttempts)
	case p.Backoff.Base < 0:
		return fmt.Errorf("%w: negative %s.Backoff.Base %s", ErrInvalidOptions, who, p.Backoff.Base)
	case p.Backoff.Max < 0:
		return fmt.Errorf("%w: negative %s.Backoff.Max %s", ErrInvalidOptions, who, p.Backoff.Max)
	}
	return nil
}

// DefaultMaxAttempts is the MaxAttempts used when none is given.
const DefaultMaxAttempts = 5

// DefaultTimeout is the WorkerOptions.Timeout used when none is given: long
// enough for any job that is not hung, and equal to RabbitMQ's default
// consumer_timeout, so a hung handler is given up after the same time on
// every broker.
const DefaultTimeout = 30 * time.Minute

// Shutdown defaults. [Worker.Run] returns at most DrainTimeout +
// SettleTimeout + 1s after its context ends, plus a Flush bounded by
// SettleTimeout: with these defaults 15 + 5 + 1 + 5 = 26s, inside the 30s
// grace period Kubernetes gives a pod between SIGTERM and SIGKILL, with 4s
// left to close the broker (ARCHITECTURE.md, "Shutdown").
const (
	DefaultDrainTimeout  = 15 * time.Second
	DefaultSettleTimeout = 5 * time.Second
)

// inherit fills the fields p leaves zero from parent (the Worker's Retry,
// with its defaults applied).
func (p RetryPolicy) inherit(parent RetryPolicy) RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = parent.MaxAttempts
	}
	if p.Backoff.Max <= 0 {
		// The entry's own Base, longer than the inherited Max, raises it,
		// as a Base longer than the default Max does; an entry's own Max
		// caps even an inherited Base that is longer.
		p.Backoff.Max = max(parent.Backoff.Max, p.Backoff.Base)
	}
	if p.Backoff.Base <= 0 {
		p.Backoff.Base = parent.Backoff.Base
	}
	if p.Backoff.Jitter == 0 {
		p.Backoff.Jitter = parent.Backoff.Jitter
	}
	return p
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	p.Backoff = p.Backoff.withDefaults()
	return p
}

// WorkerOptions configures a [Worker]. The zero value, with Queue set, is a
// sensible worker.
type WorkerOptions struct {
	// Queue to consume. Required, unless Queues is set.
	Queue string
	// Queues, instead of Queue, makes the Worker consume several queues
	// with one pool of handlers: while several have work, each gets a share
	// of the slots (Concurrency + Prefetch) in proportion to its Weight
	// (smooth weighted round robin), or, with Priority, the first queue in
	// the list with work gets them all. Each queue has its own Receive loop,
	// so an empty queue never delays the others; it holds at most two slots
	// while it waits (not the second when the other queues would then
	// have none).
	// [Worker.Pause] and [Worker.Resume] stop and restart receiving from
	// one queue. See ARCHITECTURE.md, "Several queues per Worker".
	Queues []WorkerQueue
	// QueueIdleWait bounds, with several Queues, how long a Receive may
	// wait on a queue; when it runs out the queue counts as idle and asks
	// for one delivery at a time (so a queue that ran dry holds one slot,
	// not the ones the others could use) until a Receive fills again. An
	// idle queue polls every QueueIdleWait while it holds a slot. Zero
	// means 500ms; negative, or positive below [MinQueueIdleWait] (1ms), is
	// refused ([ErrInvalidOptions]): a wait that runs out before a Receive
	// can return cuts every one off empty (at 1ns a Worker of several
	// queues ran no job). A Receive cut off this way is
	// neither a success nor a failure for [Worker.Health] (see [Health]);
	// one that fails with an error of its own, even past QueueIdleWait,
	// failed.
	QueueIdleWait time.Duration
	// Priority makes Queues a strict priority list: a queue gets slots only
	// while every queue before it is idle or paused. Lower queues can
	// starve.
	Priority bool
	// ReceiveLoops is how many Receive calls a Worker of one queue keeps
	// in flight at once, each filling the slots free when it starts.
	// Default 1, or on a [ReceiveBatcher] (SQS) as many as fill
	// Concurrency + Prefetch in one round of calls, at most
	// [MaxDefaultReceiveLoops]: one SQS long poll returns at most 10, so a
	// single loop caps a Worker at 10 messages a round trip whatever its
	// Concurrency. On a ReceiveBatcher each Receive takes at most its batch
	// of the free slots, so that the loops' calls are in flight together
	// and full. With several Queues each queue has its own loop and
	// ReceiveLoops is unused. Negative is refused; more than Concurrency +
	// Prefetch counts as that many (a loop beyond the slots never holds one).
	ReceiveLoops int
	// Concurrency is how many handlers run at once. Default (zero) 8;
	// negative is refused, and so is a Concurrency + Prefetch above
	// 2147483647 (math.MaxInt32). Deliveries of one Receive run concurrently, so
	// order within an ordering key (an SQS FIFO message group) holds only
	// with Concurrency 1 and Prefetch 1.
	Concurrency int
	// Prefetch is how many deliveries may wait, received but not yet started,
	// beyond the running ones. Their leases run while they wait, and no
	// other Worker can run them. Default (zero) Concurrency; negative is
	// refused. Raise it for many short jobs where a Receive is a costly
	// round trip (a PostgreSQL claim of 8 costs about what a claim of 100
	// does: see BENCHMARKS.md); keep it low for long jobs, which other
	// Workers should take instead.
	Prefetch int
	// Retry is the retry policy for job types without their own.
	Retry RetryPolicy
	// RetryByType overrides Retry per Message.Type. A field an entry leaves
	// zero (MaxAttempts, or one of Backoff's; a negative one is refused, as
	// in Retry) is Retry's, as a zero TimeoutByType entry is Timeout: an
	// entry that only slows one type's backoff keeps the Worker's
	// MaxAttempts. An entry's Max caps its delays
	// even below an inherited Base; an entry's Base longer than the
	// inherited Max raises that Max to it.
	RetryByType map[string]RetryPolicy
	// Timeout bounds each handler run. When it passes, the handler's context
	// is cancelled with cause [ErrJobTimeout] (context.Cause(ctx); it matches
	// context.DeadlineExceeded) and ctx.Err() is context.DeadlineExceeded,
	// as for a context made by context.WithDeadline; ctx.Deadline() reports
	// the job's deadline (the timeout counts from when the Worker first saw
	// the handler run, or from the handler's first call to Deadline, if
	// earlier). The heartbeat stops extending the delivery's lease,
	// and the delivery is settled as a transient failure: Retry with backoff
	// while attempts remain, else DeadLetter, with a cause wrapping
	// ErrJobTimeout (a handler that still returns nil is acked: its work is
	// done). A handler that ignores its context cannot be stopped (Go has no
	// way to), but it no longer holds its job: its lease runs out, the broker
	// delivers the job again (counting an attempt), and a late settlement
	// after another consumer took it is refused ([ErrLeaseLost]); RabbitMQ,
	// which has no leases, frees it
	// by its consumer_timeout. See ARCHITECTURE.md, "Attempts, leases and
	// heartbeats". The Worker checks timeouts every twentieth of the
	// shortest one (between 1ms and 1s), so a timeout fires up to two such
	// ticks late. Default [DefaultTimeout]; negative means no limit.
	Timeout time.Duration
	// TimeoutByType overrides Timeout per Message.Type (0: Timeout;
	// negative: no limit for that type).
	TimeoutByType map[string]time.Duration
	// Lease is the lease length the Worker asks for when it extends a lease;
	// it must not exceed the broker's lease (visibility timeout), or leases
	// run out between heartbeats. Default: the broker's, when it reports one
	// ([LeaseReporter]), else 30s. Negative is refused.
	Lease time.Duration
	// HeartbeatInterval is how often held deliveries' leases are extended.
	// Default Lease/3; at most Lease/2, so that one failed extension can be
	// retried before the lease ends. A failed extension is retried after a
	// pause of at most 50 ms, doubling, until a tick (HeartbeatInterval/2)
	// of the lease is left. Negative disables heartbeats.
	HeartbeatInterval time.Duration
	// DrainTimeout bounds shutdown: handlers still running this long after Run's
	// context is done have their context cancelled (cause [ErrShutdown]) and
	// their deliveries released. Default (zero) [DefaultDrainTimeout];
	// negative is refused.
	DrainTimeout time.Duration
	// SettleTimeout bounds each settlement call. Default (zero)
	// [DefaultSettleTimeout]; negative is refused; one above about 73 years
	// (math.MaxInt64/4) is taken as that.
	SettleTimeout time.Duration
	// Middleware wraps the handler, the first outermost.
	Middleware []Middleware
	// Observers see every delivery start and settle (telemetry, tests).
	// One listed twice (the same pointer) is refused ([ErrInvalidOptions]):
	// it would see each delivery twice (two spans and in-flight counts, one
	// of each never ended).
	Observers []Observer
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
	// StrictConfig makes [NewWorker] fail with a [*ConfigError] (matching
	// [ErrConfigConflict]) when the options contradict what the broker
	// reports about itself (see [CheckConfig]): MaxAttempts above the
	// broker's poison cap, a heartbeat too slow for the broker's lease, a
	// timeout longer than the lease without heartbeats. Without it each
	// conflict is logged as a warning when the Worker is made, and the Worker
	// dead-letters a transient failure at the broker's cap itself (before the
	// broker would), so the dead letter keeps the handler's error instead of
	// "max deliveries exceeded".
	StrictConfig bool
	// Rand draws backoff jitter. Give a seeded source for deterministic
	// tests. Default: a random source. Used under a lock.
	Rand *rand.Rand
}

// MinQueueIdleWait is the shortest [WorkerOptions.QueueIdleWait] [NewWorker]
// takes: long enough for a Receive with work waiting to return before its
// wait runs out. A shorter positive one is refused ([ErrInvalidOptions]).
const MinQueueIdleWait = time.Millisecond

// maxCapacity bounds Concurrency + Prefetch: a slot's index is an int32.
const maxCapacity = math.MaxInt32

// maxSettleTimeout bounds SettleTimeout (about 73 years), so that the
// deadlines the Worker computes from it cannot overflow.
const maxSettleTimeout = time.Duration(math.MaxInt64 / 4)

// MaxDefaultReceiveLoops bounds the ReceiveLoops a Worker picks for itself on
// a [ReceiveBatcher] when [WorkerOptions.ReceiveLoops] is unset.
const MaxDefaultReceiveLoops = 4

func (o WorkerOptions) withDefaults() (WorkerOptions, error) {
	if err := o.validateQueues(); err != nil {
		return o, fmt.Errorf("berth: worker: %w", err)
	}
	// A negative count or duration where zero means the default is a
	// mistake (a sign error, a bad subtraction): refused, not defaulted.
	// (Negative Timeout, TimeoutByType and HeartbeatInterval mean "none".)
	switch {
	case o.Concurrency < 0 || o.Prefetch < 0 || o.ReceiveLoops < 0:
		return o, fmt.Errorf("%w: negative Concurrency (%d), Prefetch (%d) or ReceiveLoops (%d)", ErrInvalidOptions, o.Concurrency, o.Prefetch, o.ReceiveLoops)
	case o.QueueIdleWait < 0:
		return o, fmt.Errorf("%w: negative QueueIdleWait %s", ErrInvalidOptions, o.QueueIdleWait)
	case o.QueueIdleWait > 0 && o.QueueIdleWait < MinQueueIdleWait:
		// Cut off before it can return, every Receive of a Worker of
		// several queues would come back empty.
		return o, fmt.Errorf("%w: QueueIdleWait %s below %s (MinQueueIdleWait)", ErrInvalidOptions, o.QueueIdleWait, MinQueueIdleWait)
	case o.Lease < 0:
		return o, fmt.Errorf("%w: negative Lease %s", ErrInvalidOptions, o.Lease)
	case o.DrainTimeout < 0:
		return o, fmt.Errorf("%w: negative DrainTimeout %s", ErrInvalidOptions, o.DrainTimeout)
	case o.SettleTimeout < 0:
		return o, fmt.Errorf("%w: negative SettleTimeout %s", ErrInvalidOptions, o.SettleTimeout)
	}
	if first, again, ok := repeatedObserver(o.Observers); ok {
		return o, fmt.Errorf("%w: Observers[%d] is Observers[%d] again (%T): it would see every delivery twice", ErrInvalidOptions, again, first, o.Observers[first])
	}
	if err := o.Retry.validate("Retry"); err != nil {
		return o, err
	}
	for _, t := range sortedKeys(o.RetryByType) { // the same type named at every call
		if err := o.RetryByType[t].validate(fmt.Sprintf("RetryByType[%q]", t)); err != nil {
			return o, err
		}
	}
	if o.QueueIdleWait == 0 {
		o.QueueIdleWait = 500 * time.Millisecond
	}
	if o.ReceiveLoops == 0 {
		o.ReceiveLoops = 1
	}
	if o.Concurrency == 0 {
		o.Concurrency = 8
	}
	if o.Prefetch == 0 {
		o.Prefetch = o.Concurrency
	}
	if o.Concurrency > maxCapacity-o.Prefetch {
		// The slots are indexed by an int32, and their sum must not wrap.
		return o, fmt.Errorf("%w: Concurrency (%d) + Prefetch (%d) above %d", ErrInvalidOptions, o.Concurrency, o.Prefetch, maxCapacity)
	}
	// A loop beyond the slots could never hold one.
	o.ReceiveLoops = min(o.ReceiveLoops, o.Concurrency+o.Prefetch)
	o.Retry = o.Retry.withDefaults()
	if o.RetryByType != nil {
		m := make(map[string]RetryPolicy, len(o.RetryByType))
		for t, p := range o.RetryByType {
			m[t] = p.inherit(o.Retry).withDefaults()
		}
		o.RetryByType = m
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.TimeoutByType != nil {
		m := make(map[string]time.Duration, len(o.TimeoutByType))
		for t, d := range o.TimeoutByType {
			if d == 0 {
				d = o.Timeout
			}
			m[t] = d
		}
		o.TimeoutByType = m
	}
	if o.Lease == 0 {
		o.Lease = 30 * time.Second
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = o.Lease / 3
	}
	if o.HeartbeatInterval > o.Lease/2 {
		return o, fmt.Errorf("%w: HeartbeatInterval %s is longer than half the Lease %s: leases would run out between heartbeats and long jobs run twice", ErrInvalidOptions, o.HeartbeatInterval, o.Lease)
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.SettleTimeout == 0 {
		o.SettleTimeout = DefaultSettleTimeout
	}
	// A longer bound is no bound in practice, and the Worker adds it to
	// clock readings (a settlement's deadline, the drain's grace): near
	// math.MaxInt64 the sums wrapped to deadlines in the past.
	o.SettleTimeout = min(o.SettleTimeout, maxSettleTimeout)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Rand == nil {
		o.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return o, nil
}

// LeaseReporter is implemented by subscribers that lease deliveries for a
// fixed time; NewWorker uses it as the default WorkerOptions.Lease so the two
// cannot disagree.
type LeaseReporter interface {
	Lease() time.Duration
}

// Action is what the Worker did with a delivery.
type Action string

// The settlement actions.
const (
	ActionAck        Action = "ack"
	ActionRetry      Action = "retry"
	ActionDeadLetter Action = "dead_letter"
	ActionRelease    Action = "release"    // handed back without consuming an attempt
	ActionLeaseLost  Action = "lease_lost" // not settled: the lease was lost
)

// Settlement describes how one delivery was settled.
type Settlement struct {
	Action   Action
	Delay    time.Duration // for ActionRetry and ActionRelease; at most MaxDelay, as every broker applies it
	Class    ErrorClass    // class of the handler's error
	Cause    error         // the handler's error, nil on success
	Err      error         // the settlement call's own error, if it failed
	Duration time.Duration // handler run time (set when the Worker has observers)
	Received time.Time     // when Receive returned the delivery (set when the Worker has observers)
}

// Observer sees each delivery the Worker processes. Start is called before the
// middleware chain with the delivery's context and returns the context the
// handler runs in (to carry a span, a correlation ID); Settled is called after
// the settlement with that context. Both are called from many goroutines at
// once and must be quick. Settlements of one message can reach Settled out of
// order: a retry is reported once the broker has taken it, and the broker may
// already have handed the next attempt to another goroutine.
//
// A panic in an observer's method (Start, Settled, LeaseExtended) is
// recovered and logged at ERROR with the observer's type; the Worker goes on
// as if the method had returned (Start as if it had returned the context it
// was given), and the observers after it are still called: an observer's bug
// changes no settlement and frees every slot. A Start that returns a nil
// context is the same kind of bug: the context it was given is used, and it
// is logged once per Worker. One that calls runtime.Goexit (t.FailNow) ends
// the Worker's goroutine, which is replaced: a Goexit in Start settles the
// delivery as a handler's Goexit does ([ErrGoexit]), and one in Settled
// still frees the delivery's slot and the observers after it are still
// told of the settlement.
type Observer interface {
	Start(ctx context.Context, d Delivery) context.Context
	Settled(ctx context.Context, d Delivery, s Settlement)
}

// LeaseObserver is an optional extension of Observer told of every lease
// extension attempt by the heartbeat (err nil on success), with the handler's
// context once the handler runs (before, the Worker's). A panic in it is
// recovered as Observer's are: the heartbeat acts on err regardless, and
// has already acted on it when one calls runtime.Goexit.
type LeaseObserver interface {
	LeaseExtended(ctx context.Context, d Delivery, by time.Duration, err error)
}

// repeatedObserver returns the indexes of the first Observer of obs listed
// again, and of its repetition. Only pointers are compared (an Observer of
// another type may not be comparable, and one with no pointer keeps no
// per-delivery state of its own).
func repeatedObserver(obs []Observer) (first, again int, ok bool) {
	seen := make(map[Observer]int, len(obs))
	for i, ob := range obs {
		if ob == nil || reflect.TypeOf(ob).Kind() != reflect.Pointer {
			continue
		}
		if j, dup := seen[ob]; dup {
			return j, i, true
		}
		seen[ob] = i
	}
	return 0, 0, false
}
