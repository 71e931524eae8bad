package idempotency

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/berthq/berth/sdk"
)

// Mode selects how the guard holds a key while the handler runs.
type Mode int

const (
	// Transactional holds the key in a transaction that also carries the
	// handler's writes and the result (requires a [TxStore]).
	Transactional Mode = iota + 1
	// Lease claims the key in_progress with an expiry and runs the handler
	// outside any transaction.
	Lease
)

// String returns the mode's name, "transactional" or "lease".
func (m Mode) String() string {
	switch m {
	case Transactional:
		return "transactional"
	case Lease:
		return "lease"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults of [Options].
const (
	DefaultClaimLease      = 5 * time.Minute
	DefaultInProgressDelay = 2 * time.Second
	DefaultRetention       = 7 * 24 * time.Hour
	DefaultCleanupTimeout  = 5 * time.Second
)

// Options configures a [Guard]. Store is required; the zero value of every
// other field is a sensible default.
type Options struct {
	// Store holds the keys: the source of truth.
	Store Store
	// Mode defaults to Transactional when Store is a [TxStore], else Lease.
	Mode Mode
	// Cache, optional, is consulted before the store and written after success.
	Cache Cache
	// CacheTTL is how long the cache remembers a completed key. Default
	// Retention.
	CacheTTL time.Duration
	// Key extracts the key of a message. Default [MessageKey].
	Key KeyFunc
	// MissingKey says what to do with a message without a key. Default
	// [MissingKeyReject].
	MissingKey MissingKey
	// Fingerprint digests a message's payload. Default [Fingerprint].
	Fingerprint FingerprintFunc
	// ClaimLease is how long a lease-mode claim holds without a heartbeat.
	// Default 5m.
	ClaimLease time.Duration
	// Heartbeat is how often a running lease-mode claim is extended by
	// ClaimLease. Default ClaimLease/3; at most ClaimLease/2; negative
	// disables it. When the claim is lost, or extensions fail until the
	// next one would come after the claim's expiry, the handler's ctx is
	// cancelled with [ErrClaimLost]. With the heartbeat disabled nothing
	// extends the claim: the handler's ctx is cancelled with ErrClaimLost
	// when the claim expires, ClaimLease after it was taken (counted from
	// before the claim was sent, so no later than the store's expiry),
	// since another worker may then take the key over; set ClaimLease above
	// the longest run of the handler. The heartbeat lasts as long as the
	// handler runs, even after its ctx is done (shutdown, a lost delivery
	// lease, a job timeout): a handler that finishes its call anyway and
	// returns nil has applied its effect, which the guard records, and a
	// claim expiring under it would let a redelivery run the operation
	// beside it. A handler that never returns therefore holds its key
	// until its process exits. A claim lost after the ctx was done cannot
	// become its cause (the first cause stays): the handler cannot see it,
	// but Do's error then wraps ErrClaimLost.
	Heartbeat time.Duration
	// InProgressDelay is the RetryAfter delay for a duplicate that finds the
	// key in progress. Default 2s. When the delivery is not an
	// [sdk.Releaser] (its broker counts every retry as a receive, e.g. SQS)
	// and the key is a lease-mode claim, the middleware waits at least until
	// the claim expires instead: earlier retries cannot take it over and
	// would use up the receive limit of the message that must. The time the
	// claim has left is the store's [Record.LockedFor] (by the store's
	// clock), or LockedUntil by the worker's clock for a store that does
	// not report it.
	InProgressDelay time.Duration
	// Retention is how long results are kept. Default 7 days.
	Retention time.Duration
	// CleanupTimeout bounds the calls that record a handler's outcome — the
	// commit or completion after a success, the rollback or release after a
	// failure — which run even when the handler's ctx is done. A lease-mode
	// completion that fails is retried within it, and beyond it for as long
	// as the claim holds (ClaimLease after it was taken or last extended):
	// the effect is applied, no other worker can take the key over before
	// then, and a store that answers again meanwhile (a failover, a starved
	// pool) gets the result rather than leave the claim to expire and a
	// redelivery to apply the effect again (the job keeps its Worker slot
	// meanwhile); once the handler's ctx is done (a shutdown past the
	// Worker's drain), for CleanupTimeout more at most. Default 5s, or half
	// of ClaimLease − Heartbeat when that is shorter. It must be shorter
	// than ClaimLease − Heartbeat (ClaimLease when the heartbeat is
	// disabled): the claim was last extended up to one Heartbeat before the
	// handler returned, and the calls it bounds must end while the claim
	// holds, before another worker may take the key over.
	// [New] returns an error wrapping [ErrInvalidConfig] otherwise.
	CleanupTimeout time.Duration
	// Stats, optional, counts events.
	Stats *Stats
	// Observer, optional, sees every event (metrics).
	Observer Observer
	// Logger receives debug logs of duplicates and cache failures, and
	// warnings of failed store calls. Default slog.Default().
	Logger *slog.Logger
	// LogKeys writes idempotency keys into log records ("key") and into the
	// text of the guard's ErrClaimLost causes as they are. Default false: a
	// key often names a customer or a payment, and logs (and dead-letter
	// reasons) travel further than the store, so they carry "key_sha256",
	// the first 16 hex digits of the key's SHA-256 ([KeyDigest]), which
	// identifies the key to whoever knows it.
	LogKeys bool
}

// KeyDigest is how log records name an idempotency key unless
// [Options.LogKeys] is set: the first 16 hex digits of its SHA-256.
func KeyDigest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// keyText names key in an error's text (which the Worker logs and may store
// as a dead-letter reason), hashed unless Options.LogKeys.
func (g *Guard) keyText(key string) string {
	if g.o.LogKeys {
		return fmt.Sprintf("key %q", key)
	}
	return "key_sha256 " + KeyDigest(key)
}

// keyAttr is key as a log attribute, hashed unless Options.LogKeys.
func (g *Guard) keyAttr(key string) slog.Attr {
	if g.o.LogKeys {
		return sdk.LogText("key", key)
	}
	return slog.String("key_sha256", KeyDigest(key))
}

// Guard runs operations at most once per idempotency key. It is safe for
// concurrent use. Build one with [New]; use it as middleware
// ([Guard.Middleware]), for external events ([Guard.Inbox]) or directly
// ([Guard.Do]).
type Guard struct {
	o   Options
	txs TxStore
}

// New validates opts and returns a Guard.
func New(opts Options) (*Guard, error) {
	if opts.Store == nil {
		return nil, fmt.Errorf("%w: Store is required", ErrInvalidConfig)
	}
	txs, isTx := opts.Store.(TxStore)
	switch opts.Mode {
	case 0:
		opts.Mode = Lease
		if isTx {
			opts.Mode = Transactional
		}
	case Transactional:
		if !isTx {
			return nil, fmt.Errorf("%w: transactional mode needs a TxStore, %T is not one", ErrInvalidConfig, opts.Store)
		}
	case Lease:
	default:
		return nil, fmt.Errorf("%w: unknown mode %d", ErrInvalidConfig, int(opts.Mode))
	}
	if opts.MissingKey != MissingKeyReject && opts.MissingKey != MissingKeyUseMessageID {
		return nil, fmt.Errorf("%w: unknown MissingKey policy %d", ErrInvalidConfig, int(opts.MissingKey))
	}
	if opts.ClaimLease < 0 || opts.InProgressDelay < 0 || opts.Retention < 0 || opts.CacheTTL < 0 || opts.CleanupTimeout < 0 {
		return nil, fmt.Errorf("%w: negative duration", ErrInvalidConfig)
	}
	if opts.Key == nil {
		opts.Key = MessageKey
	}
	if opts.Fingerprint == nil {
		opts.Fingerprint = Fingerprint
	}
	if opts.ClaimLease == 0 {
		opts.ClaimLease = DefaultClaimLease
	}
	if opts.Heartbeat == 0 {
		opts.Heartbeat = opts.ClaimLease / 3
		if opts.Heartbeat == 0 {
			// A ticker needs a positive period.
			return nil, fmt.Errorf("%w: ClaimLease %s is too short to be extended", ErrInvalidConfig, opts.ClaimLease)
		}
	}
	if opts.Heartbeat > opts.ClaimLease/2 {
		// One failed extension would let the claim expire, and another
		// worker run the operation at the same time.
		return nil, fmt.Errorf("%w: Heartbeat %s is more than half of ClaimLease %s", ErrInvalidConfig, opts.Heartbeat, opts.ClaimLease)
	}
	if opts.InProgressDelay == 0 {
		opts.InProgressDelay = DefaultInProgressDelay
	}
	if opts.Retention == 0 {
		opts.Retention = DefaultRetention
	}
	if opts.CacheTTL == 0 {
		opts.CacheTTL = opts.Retention
	}
	hb := max(opts.Heartbeat, 0)
	if opts.CleanupTimeout == 0 {
		// The default, or less under a claim short enough to need it.
		opts.CleanupTimeout = min(DefaultCleanupTimeout, (opts.ClaimLease-hb)/2)
	}
	if opts.CleanupTimeout >= opts.ClaimLease-hb {
		return nil, fmt.Errorf("%w: CleanupTimeout %s must be shorter than ClaimLease %s − Heartbeat %s: a completion retried that long could outlive the claim",
			ErrInvalidConfig, opts.CleanupTimeout, opts.ClaimLease, hb)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Guard{o: opts, txs: txs}, nil
}

// Middleware returns a Guard's middleware as a one-liner: New, then
// [Guard.Middleware].
func Middleware(opts Options) (sdk.Middleware, error) {
	g, err := New(opts)
	if err != nil {
		return nil, err
	}
	return g.Middleware(), nil
}

// Mode returns the guard's mode.
func (g *Guard) Mode() Mode { return g.o.Mode }

// Middleware wraps a handler: a delivery whose key is completed is acked
// without running it (the handler returns nil); one whose key is in progress
// elsewhere gets [sdk.RetryAfter]; a key conflict or a missing key is
// [sdk.Permanent]; otherwise the handler runs under the key as the mode says.
func (g *Guard) Middleware() sdk.Middleware {
	return func(next sdk.Handler) sdk.Handler {
		return sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
			m := d.Message()
			key := g.o.Key(m)
			if key == "" {
				if g.o.MissingKey == MissingKeyUseMessageID && m.ID != "" {
					key = m.ID
				} else {
					g.event(ctx, EventMissingKey, m.Type)
					return sdk.Permanent(&MissingKeyError{MessageID: m.ID, Type: m.Type})
				}
			}
			op := Operation{Key: key, JobType: m.Type, Fingerprint: g.o.Fingerprint(m)}
			_, releasable := d.(sdk.Releaser)
			_, err := g.do(ctx, op, !releasable, func(ctx context.Context) error { return next.Handle(ctx, d) })
			return err
		})
	}
}

// Operation is one business operation run under a [Guard].
type Operation struct {
	Key         string // required
	JobType     string
	Fingerprint string // compared with the stored one; "" matches only ""
}

// Do runs fn at most once for op.Key (once its effect is stored). It returns
// ran=false and a nil error when the key was already completed with the same
// fingerprint; a permanent [ConflictError] for a different fingerprint; an
// [sdk.RetryAfter] wrapping [ErrInProgress] when another owner holds the key;
// fn's error, after rolling back or releasing the key, when fn fails; a
// permanent error wrapping [ErrInvalidKey] when the store cannot hold the
// key; and a transient error when the store fails. In Transactional mode fn's ctx
// carries the transaction; in both modes it carries the key ([KeyFrom]) and
// accepts a result ([SetResult]).
func (g *Guard) Do(ctx context.Context, op Operation, fn func(ctx context.Context) error) (ran bool, err error) {
	return g.do(ctx, op, false, fn)
}

// do is [Guard.Do]; retryCosts says that a retry of the caller counts an
// attempt (its delivery is not an [sdk.Releaser]).
func (g *Guard) do(ctx context.Context, op Operation, retryCosts bool, fn func(ctx context.Context) error) (ran bool, err error) {
	if op.Key == "" {
		return false, sdk.Permanent(&MissingKeyError{Type: op.JobType})
	}
	if g.o.Cache != nil {
		fp, found, err := g.o.Cache.Lookup(ctx, op.Key)
		switch {
		case err != nil:
			g.event(ctx, EventCacheError, op.JobType)
			g.o.Logger.DebugContext(ctx, "idempotency: cache lookup failed; using the store", g.keyAttr(op.Key), "err", err)
		case found && fp == op.Fingerprint:
			g.event(ctx, EventCacheHit, op.JobType)
			g.event(ctx, EventDuplicate, op.JobType)
			return false, nil
		}
		// A miss, or a different fingerprint: the store decides.
	}
	c := Claim{
		Key:         op.Key,
		JobType:     op.JobType,
		Fingerprint: op.Fingerprint,
		Owner:       newToken(),
		Lease:       g.o.ClaimLease,
		Retention:   g.o.Retention,
	}
	if g.o.Mode == Transactional {
		return g.doTx(ctx, c, retryCosts, fn)
	}
	return g.doLease(ctx, c, retryCosts, fn)
}

// found handles the outcomes in which fn does not run.
func (g *Guard) found(ctx context.Context, c Claim, out Outcome, rec *Record, retryCosts bool) error {
	if rec != nil && rec.Fingerprint != c.Fingerprint {
		g.event(ctx, EventConflict, c.JobType)
		return sdk.Permanent(&ConflictError{Key: c.Key, JobType: c.JobType, Stored: rec.JobType, hashed: !g.o.LogKeys})
	}
	switch out {
	case Completed:
		g.event(ctx, EventDuplicate, c.JobType)
		g.o.Logger.DebugContext(ctx, "idempotency: duplicate suppressed", g.keyAttr(c.Key), sdk.LogText("job_type", c.JobType))
		g.remember(ctx, c)
		return nil
	case InProgress:
		g.event(ctx, EventInProgress, c.JobType)
		delay := g.o.InProgressDelay
		if retryCosts && rec != nil {
			// Every retry counts an attempt: none before the claim
			// expires, when this delivery may take it over. The time it
			// has left is the store's, by its own clock: LockedUntil
			// against the worker's clock would retry too early when that
			// clock runs ahead of the store's.
			left := rec.LockedFor
			if left == 0 && !rec.LockedUntil.IsZero() {
				left = time.Until(rec.LockedUntil) // a store that does not report LockedFor
			}
			delay = max(delay, left)
		}
		return sdk.RetryAfter(fmt.Errorf("%w: %s", ErrInProgress, g.keyText(c.Key)), delay)
	}
	return fmt.Errorf("idempotency: store returned unexpected outcome %v for %s", out, g.keyText(c.Key))
}

func (g *Guard) doTx(ctx context.Context, c Claim, retryCosts bool, fn func(ctx context.Context) error) (ran bool, err error) {
	tx, out, rec, err := g.txs.Begin(ctx, c)
	if err != nil {
		return false, err
	}
	if out != Acquired {
		if tx != nil {
			_ = tx.Rollback(ctx)
		}
		return false, g.found(ctx, c, out, rec, retryCosts)
	}
	r := &running{key: c.Key}
	hctx := tx.Context(context.WithValue(ctx, guardKey{}, r))
	ended := false
	defer func() {
		if !ended { // fn panicked
			g.cleanup(ctx, tx.Rollback, rollbackFailed)
		}
	}()
	if err := fn(hctx); err != nil {
		ended = true
		g.cleanup(ctx, tx.Rollback, rollbackFailed)
		return true, err
	}
	ended = true
	// fn succeeded: commit even if ctx was cancelled meanwhile (shutdown,
	// lost delivery lease), so the work is not thrown away.
	cctx, cancel := g.detached(ctx)
	err = tx.Commit(cctx, r.result())
	cancel()
	if err != nil {
		g.cleanup(ctx, tx.Rollback, rollbackFailed)
		return true, fmt.Errorf("idempotency: commit %s: %w", g.keyText(c.Key), err)
	}
	g.event(ctx, EventExecuted, c.JobType)
	g.remember(ctx, c)
	return true, nil
}

func (g *Guard) doLease(ctx context.Context, c Claim, retryCosts bool, fn func(ctx context.Context) error) (ran bool, err error) {
	claimed := time.Now() // the claim expires ClaimLease after this, at the earliest
	release := func(cctx context.Context) error { return g.o.Store.Release(cctx, c) }
	out, rec, err := g.o.Store.Claim(ctx, c)
	if err != nil {
		if !sdk.IsPermanent(err) {
			// The store may have taken the claim and its answer been lost
			// (a connection reset, ctx cancelled while the statement ran):
			// release it by its owner token, which only this attempt holds,
			// or the key would stay in progress, owned by nobody, until the
			// claim expired, and every redelivery until then be retried.
			g.cleanupQuiet(ctx, c.Key, release)
		}
		return false, err
	}
	switch out {
	case Acquired:
	case TakenOver:
		g.event(ctx, EventTakeover, c.JobType)
	default:
		return false, g.found(ctx, c, out, rec, retryCosts)
	}
	r := &running{key: c.Key}
	hctx, cancel := context.WithCancelCause(context.WithValue(ctx, guardKey{}, r))
	// lost is the heartbeat's ErrClaimLost, read after stop (which waits for
	// it): once ctx is done it cannot become hctx's cause (the first stays).
	// held is when the claim was taken or last extended, also read after
	// stop: it holds until ClaimLease after that.
	var lost error
	held := claimed
	stop := g.heartbeat(hctx, c, &held, func(cause error) { lost = cause; cancel(cause) })
	ended := false
	defer func() {
		stop()
		cancel(nil)
		if !ended { // fn panicked
			g.cleanup(ctx, release, releaseFailed)
		}
	}()
	ferr := fn(hctx)
	stop()
	ended = true
	if ferr != nil {
		g.cleanup(ctx, release, releaseFailed)
		if lost != nil {
			g.event(ctx, EventClaimLost, c.JobType)
			return true, errors.Join(ferr, lost)
		}
		return true, ferr
	}
	// fn's effect is applied: record it even if ctx was cancelled meanwhile.
	// A claim left in progress would expire and be taken over by the
	// redelivery, which would apply the effect a second time.
	if err := g.complete(ctx, c, r.result(), held.Add(g.o.ClaimLease)); err != nil {
		if errors.Is(err, ErrClaimLost) {
			g.event(ctx, EventClaimLost, c.JobType)
		}
		return true, fmt.Errorf("idempotency: complete %s: %w", g.keyText(c.Key), err)
	}
	g.event(ctx, EventExecuted, c.JobType)
	g.remember(ctx, c)
	return true, nil
}

// complete records a lease-mode success, retrying transient failures until
// the claim expires (until, ClaimLease after it was taken or last extended,
// by this process's clock), and for CleanupTimeout at least: the effect is
// applied, and a claim left in progress would expire and be taken over by a
// redelivery that applies it again. Until then no other worker can take the
// key over, so a store that answers again in time (a failover, a starved
// pool) gets the result. It runs on a context that survives ctx's
// cancellation. Retrying is safe: Complete is fenced by the owner token, and
// a first call that did complete (its answer lost) makes the next one return
// nil, not ErrClaimLost.
func (g *Guard) complete(ctx context.Context, c Claim, r Result, until time.Time) error {
	deadline := time.Now().Add(g.o.CleanupTimeout)
	if until.After(deadline) {
		deadline = until
	}
	cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	// Once ctx is done (the Worker's drain deadline passed, a lost lease),
	// CleanupTimeout more at most, as before the retries outlived it: the
	// Worker gives up on a handler that outlasts its drain, and a shutdown
	// must not wait for the rest of the claim.
	var (
		mu    sync.Mutex
		timer *time.Timer
	)
	unwatch := context.AfterFunc(ctx, func() {
		mu.Lock()
		timer = time.AfterFunc(g.o.CleanupTimeout, cancel)
		mu.Unlock()
	})
	defer func() {
		unwatch()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
	}()
	wait := 20 * time.Millisecond
	for failures := 0; ; failures++ {
		err := g.o.Store.Complete(cctx, c, r)
		if err == nil || errors.Is(err, ErrClaimLost) {
			return err
		}
		if failures == 0 {
			g.o.Logger.WarnContext(ctx, "idempotency: recording the result failed; retrying", g.keyAttr(c.Key), "err", err)
		} else {
			g.o.Logger.DebugContext(ctx, "idempotency: recording the result failed again; retrying", g.keyAttr(c.Key), "err", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-cctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// heartbeat extends c while fn runs, one Heartbeat after the claim was taken
// or last extended (at *heldp, which it moves to each extension's start, for
// the caller to read after stop), not after fn started: a claim whose answer came
// late has less than ClaimLease left, and is extended at once if a Heartbeat
// has passed. When the claim is lost, or extensions keep failing until the
// claim (extended last at held) would expire before the next try, it cancels
// fn's context with ErrClaimLost.
// Each Extend is bounded by the time the claim has left: one that hangs (a
// starved connection pool, a silently dropped link) must not outlast the
// claim, which another worker would then take over while fn still runs.
// It goes on after ctx is done, until stop: fn may still be applying its
// effect (and its success is recorded), so the claim must not expire under
// it. stop cancels an Extend under way and waits for the goroutine.
func (g *Guard) heartbeat(ctx context.Context, c Claim, heldp *time.Time, cancel context.CancelCauseFunc) (stop func()) {
	if g.o.Heartbeat < 0 {
		return g.expiry(c, *heldp, cancel)
	}
	held := *heldp
	hbctx, done := context.WithCancel(context.WithoutCancel(ctx))
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTimer(time.Until(held.Add(g.o.Heartbeat)))
		defer t.Stop()
		for {
			select {
			case <-hbctx.Done():
				return
			case <-t.C:
				sent := time.Now()
				ectx, ecancel := context.WithDeadline(hbctx, held.Add(g.o.ClaimLease))
				err := g.o.Store.Extend(ectx, c, g.o.ClaimLease)
				ecancel()
				if hbctx.Err() != nil {
					return // stopped: fn returned
				}
				if errors.Is(err, ErrClaimLost) {
					cancel(fmt.Errorf("%w: %s", ErrClaimLost, g.keyText(c.Key)))
					return
				}
				if err == nil {
					held = sent
					*heldp = sent // read by the caller after stop
					t.Reset(time.Until(held.Add(g.o.Heartbeat)))
					continue
				}
				if time.Since(held)+g.o.Heartbeat >= g.o.ClaimLease { // the next try would come too late
					cancel(fmt.Errorf("%w: %s: not extended within the claim lease: %w", ErrClaimLost, g.keyText(c.Key), err))
					return
				}
				g.o.Logger.WarnContext(ctx, "idempotency: claim extension failed", g.keyAttr(c.Key), "err", err)
				t.Reset(g.o.Heartbeat)
			}
		}
	}()
	return func() {
		done()
		<-exited
	}
}

// expiry stands in for the heartbeat when it is disabled: nothing extends
// the claim, so it expires ClaimLease after it was taken, and another worker
// may then take it over and run the operation beside fn. expiry cancels fn's
// context with ErrClaimLost then, as the heartbeat does when it cannot
// extend the claim in time. The time is counted on this process's monotonic
// clock from held, taken before the claim was sent, so it comes no later
// than the store's expiry (the store counts from when it wrote the claim),
// whatever the two wall clocks read. Like the heartbeat it goes on after
// ctx is done, until stop, which waits for its goroutine.
func (g *Guard) expiry(c Claim, held time.Time, cancel context.CancelCauseFunc) (stop func()) {
	t := time.NewTimer(time.Until(held.Add(g.o.ClaimLease)))
	stopped, done := context.WithCancel(context.Background())
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-stopped.Done():
		case <-t.C:
			cancel(fmt.Errorf("%w: %s: the claim expired (ClaimLease %s; the heartbeat is disabled)", ErrClaimLost, g.keyText(c.Key), g.o.ClaimLease))
		}
	}()
	return func() {
		t.Stop()
		done()
		<-exited
	}
}

// detached returns a context for recording an outcome (commit, rollback,
// release; a lease-mode completion has [Guard.complete]'s): it keeps ctx's
// values, survives ctx's cancellation and is bounded by CleanupTimeout.
func (g *Guard) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), g.o.CleanupTimeout)
}

// What a failed cleanup means, per mode.
const (
	// A lease-mode claim that could not be released expires by itself.
	releaseFailed = "idempotency: releasing the claim failed; the key frees itself when its claim expires"
	// A transaction whose rollback failed holds no claim: the database ends
	// it when its connection closes, which pgx does after a failed rollback.
	rollbackFailed = "idempotency: rollback failed; the database ends the transaction when its connection closes"
)

// cleanup runs f (rollback, release) with a [Guard.detached] context and
// logs msg if it fails.
func (g *Guard) cleanup(ctx context.Context, f func(context.Context) error, msg string) {
	cctx, cancel := g.detached(ctx)
	defer cancel()
	if err := f(cctx); err != nil && !errors.Is(err, ErrClaimLost) {
		g.o.Logger.WarnContext(ctx, msg, "err", err)
	}
}

// cleanupQuiet is [Guard.cleanup] for a release after a failed claim: the
// claim most often was never stored (the store is down, and the release then
// fails as the claim did), so a failure is logged at debug level only.
func (g *Guard) cleanupQuiet(ctx context.Context, key string, f func(context.Context) error) {
	cctx, cancel := g.detached(ctx)
	defer cancel()
	if err := f(cctx); err != nil && !errors.Is(err, ErrClaimLost) {
		g.o.Logger.DebugContext(ctx, "idempotency: releasing a claim whose answer was lost failed; if it was stored, the key frees itself when it expires", g.keyAttr(key), "err", err)
	}
}

func (g *Guard) remember(ctx context.Context, c Claim) {
	if g.o.Cache == nil {
		return
	}
	if err := g.o.Cache.Remember(ctx, c.Key, c.Fingerprint, g.o.CacheTTL); err != nil {
		g.event(ctx, EventCacheError, c.JobType)
		g.o.Logger.DebugContext(ctx, "idempotency: cache write failed", g.keyAttr(c.Key), "err", err)
	}
}

func (g *Guard) event(ctx context.Context, e Event, jobType string) {
	if g.o.Stats != nil {
		g.o.Stats.Observe(ctx, e, jobType)
	}
	if g.o.Observer != nil {
		g.o.Observer.Observe(ctx, e, jobType)
	}
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
