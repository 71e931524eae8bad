// Package redislock is a Redis lock on a named resource, with an owner token,
// a watchdog and fencing tokens.
//
// A lock is an efficiency tool: it keeps two workers from doing the same
// expensive work at the same time. It is not a correctness tool. A lock held in
// Redis can be lost while its holder still believes it holds it — the holder
// pauses (GC, SIGSTOP, a slow disk, a VM migration) past the lock's TTL, the
// network drops the extension, Redis fails over and forgets the key — and
// another worker then takes it. Correctness comes from idempotency (a unique
// key row per business operation) and from the database (row locks,
// optimistic versions, state transitions, unique constraints). Use a lock to
// save work; never rely on it alone to prevent a duplicate effect.
//
// What this package does to narrow the gap:
//   - Each [Lock] has a random owner token; only the owner can extend or
//     release it (compare-and-act in a Lua script), so an expired holder never
//     deletes its successor's lock.
//   - [Client.Run] runs work under a watchdog that extends the lock while the
//     work runs and cancels the work's context, with cause [ErrLockLost], as
//     soon as the lock is lost or can no longer be confirmed before it
//     expires.
//   - Each acquisition gets a fencing token, [Lock.Token]: a per-resource
//     counter incremented (INCR) in the same Lua script that takes the lock,
//     so tokens grow with every holder. A write that records and checks the
//     token (package fence) is refused when a later holder already wrote: the
//     paused holder that wakes up cannot overwrite its successor's work.
//
// [Client.Middleware] locks a resource named by each message (e.g. the order
// id) around a handler; a busy resource becomes a short sdk.RetryAfter, which
// the Worker does not count as a failed attempt.
//
// Keys: the lock is "<prefix>{<resource>}", its fencing counter
// "<prefix>{<resource>}:fence" and, for the lock's TTL after a release, a
// release marker "<prefix>{<resource>}:released:<owner token>" (one hash
// slot, for Redis Cluster, and resources spread over the slots: [New]
// refuses a prefix with braces, whose tag would come first). A resource starting with "}", which would make
// the hash tag empty, is written in hex: "<prefix>{<hex>}~" and so on
// (earlier versions used the plain form, which Redis Cluster refused with
// CROSSSLOT; on a single Redis such a name's counter starts again at 1 under
// the new key, and rows fenced with its old tokens refuse the new ones until
// they catch up). The counter never expires: deleting it would restart
// tokens at 1 and break fencing. That is one small key per resource ever
// locked; delete a resource's counter only when nothing will ever write that
// resource again.
// Fencing therefore also assumes Redis keeps the counter (persistence on, no
// failover to a replica that lost writes).
package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berthq/berth/sdk"
	"github.com/redis/go-redis/v9"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrBusy reports a lock held by someone else. It arrives wrapped in
	// sdk.RetryAfter, as a [*BusyError].
	ErrBusy = errors.New("redislock: resource busy")
	// ErrLockLost reports a lock that is no longer ours: it expired or was
	// taken. It is the cancellation cause of the work's context in
	// [Client.Run], and the error of Extend and Release on a lost lock.
	ErrLockLost = errors.New("redislock: lock lost")
	// ErrInvalidResource reports an empty resource name.
	ErrInvalidResource = errors.New("redislock: invalid resource name")
	// ErrInvalidOptions reports [Options] (or a Redis client) that [New]
	// refuses.
	ErrInvalidOptions = errors.New("redislock: invalid options")
)

// BusyError describes a lock that was not obtained. It wraps [ErrBusy].
type BusyError struct {
	Resource string
	// Remaining is how long the current holder's lock has left, as Redis
	// reported it (0 when unknown).
	Remaining time.Duration
}

// Error describes the busy resource.
func (e *BusyError) Error() string {
	return fmt.Sprintf("redislock: %q busy (held for %s more)", e.Resource, e.Remaining)
}

// Unwrap returns ErrBusy.
func (e *BusyError) Unwrap() error { return ErrBusy }

// Options configure a [Client]. The zero value is a sensible default.
type Options struct {
	// Prefix starts every key. Default "berth:lock:". It may not contain
	// "{" or "}": the hash tag of each key is the resource's, which puts
	// a lock's keys in one Redis Cluster slot and spreads the resources
	// over the slots. A tag in the prefix would come first and win: every
	// lock in one slot (one node), or, empty ("{}"), each key hashed
	// whole and every script refused with CROSSSLOT.
	Prefix string
	// TTL is the lock's lifetime in Redis without extension. Default 30s;
	// at least 10ms. Redis counts it in whole milliseconds: a fraction of
	// a millisecond is dropped (the lock would expire in Redis that much
	// before the holder's watchdog expects it to).
	TTL time.Duration
	// ExtendEvery is how often the watchdog of [Client.Run] extends the
	// lock. Default TTL/3; must be below TTL.
	ExtendEvery time.Duration
	// BusyDelay is the longest delay put in the RetryAfter error of a busy
	// resource; the delay is the holder's remaining TTL when that is
	// shorter. Default 1s.
	BusyDelay time.Duration
}

// Client obtains locks. It is safe for concurrent use and holds no goroutine:
// there is nothing to close.
type Client struct {
	rdb         redis.Scripter
	prefix      string
	ttl         time.Duration
	extendEvery time.Duration
	busyDelay   time.Duration
}

// New validates opts and returns a Client using rdb (a *redis.Client,
// *redis.ClusterClient or *redis.Ring). Options it refuses give an error
// wrapping [ErrInvalidOptions].
//
// go-redis honours a call's ctx only while it waits for a connection
// unless the client's ContextTimeoutEnabled option is set: without it, an
// Obtain, Extend or Release whose ctx ends waits for Redis's answer up to
// the client's ReadTimeout (3s by default) a try, and an abandoned Obtain's
// release can take that long rather than the second it is given. Run's
// watchdog does not depend on it (it counts the lock lost at its TTL);
// set ContextTimeoutEnabled for calls that end with their ctx.
func New(rdb redis.Scripter, opts Options) (*Client, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil Redis client", ErrInvalidOptions)
	}
	if opts.Prefix == "" {
		opts.Prefix = "berth:lock:"
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("%w: Prefix %q has a brace: the hash tag is the resource's (see Options.Prefix)", ErrInvalidOptions, opts.Prefix)
	}
	if opts.TTL < 0 || opts.ExtendEvery < 0 || opts.BusyDelay < 0 {
		return nil, fmt.Errorf("%w: negative TTL, ExtendEvery or BusyDelay", ErrInvalidOptions)
	}
	if opts.TTL == 0 {
		opts.TTL = 30 * time.Second
	}
	if opts.TTL < 10*time.Millisecond {
		return nil, fmt.Errorf("%w: TTL %s under 10ms", ErrInvalidOptions, opts.TTL)
	}
	// PX takes milliseconds: the lock lives TTL.Milliseconds() in Redis,
	// and the watchdog's reckoning of its expiry must not run past that.
	opts.TTL = opts.TTL.Truncate(time.Millisecond)
	if opts.ExtendEvery == 0 {
		opts.ExtendEvery = opts.TTL / 3
	}
	if opts.ExtendEvery >= opts.TTL {
		return nil, fmt.Errorf("%w: ExtendEvery %s not below TTL %s", ErrInvalidOptions, opts.ExtendEvery, opts.TTL)
	}
	if opts.BusyDelay == 0 {
		opts.BusyDelay = time.Second
	}
	return &Client{rdb: rdb, prefix: opts.Prefix, ttl: opts.TTL, extendEvery: opts.ExtendEvery, busyDelay: opts.BusyDelay}, nil
}

// obtainScript takes the lock and, only when it did, increments the fencing
// counter: one atomic step, so no two holders share a token and tokens follow
// the order of acquisition.
//
// A lock that already holds the caller's owner token was taken by this very
// call: the client retried the script after losing its reply (go-redis
// retries a command whose connection dropped). That run answers as the first
// would have, with the token it took, instead of reporting the caller's own
// lock busy and leaving it held by no Lock for a whole TTL.
var obtainScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end
return {0, redis.call('PTTL', KEYS[1])}
`)

// releaseScript deletes the lock only when the caller still owns it, and
// leaves a marker (KEYS[2], named after the owner token, for the lock's TTL)
// that it did, holding the number of the Release call (ARGV[3]).
//
// The marker answers a run of the script that finds the lock already gone
// because this very release deleted it: the client retried the script after
// losing its reply (go-redis retries a command whose connection dropped).
// Without it that run reported the lock lost, although it was held until
// released; [Client.Run] then failed work done entirely under the lock.
// It returns 1 when this call released the lock, 2 when an earlier call
// of the same Lock did (one whose caller got a network error), 0 when the
// lock was not the caller's.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
  return 1
end
local by = redis.call('GET', KEYS[2])
if by == ARGV[3] then
  return 1
end
if by then
  return 2
end
return 0
`)

// extendScript resets the lock's TTL only when the caller still owns it.
var extendScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// Lock is a held lock. Its methods may be called from several goroutines.
type Lock struct {
	c        *Client
	resource string
	key      string
	owner    string
	token    int64
	ttl      time.Duration
	// released is set while a Release runs and after one was answered
	// (success or ErrLockLost; a network error clears it): a second
	// Release reports ErrLockLost (the release marker would answer it as
	// the first).
	released atomic.Bool
	// releases numbers the Release calls, for the release marker.
	releases atomic.Int64
}

// Resource returns the locked resource's name.
func (l *Lock) Resource() string { return l.resource }

// Token returns the fencing token of this acquisition: greater than the token
// of every earlier holder of the same resource. Pass it to the database write
// the lock protects (see package fence).
func (l *Lock) Token() int64 { return l.token }

// TTL returns the lifetime the lock is taken and extended for.
func (l *Lock) TTL() time.Duration { return l.ttl }

// Obtain tries once to take the lock on resource for the Client's TTL. A lock
// held by someone else gives an error built by sdk.RetryAfter wrapping a
// [*BusyError] ([ErrBusy]). Obtain does not wait and starts no watchdog:
// extend the lock yourself, or use [Client.Run]. When the call fails (a
// network error, ctx ending mid-call), Redis may have taken the lock all the
// same: Obtain then releases it (within a second, fenced by this call's
// owner token) before returning the error, so that the resource is not held
// by nobody for a TTL.
func (c *Client) Obtain(ctx context.Context, resource string) (*Lock, error) {
	if resource == "" {
		return nil, ErrInvalidResource
	}
	owner, err := newOwner()
	if err != nil {
		return nil, err
	}
	key := c.key(resource)
	res, err := obtainScript.Run(ctx, c.rdb, []string{key, key + ":fence"}, owner, c.ttl.Milliseconds()).Int64Slice()
	if err != nil {
		c.abandon(ctx, key, owner)
		return nil, c.wrap(ctx, "obtain", resource, err)
	}
	if len(res) != 2 {
		return nil, fmt.Errorf("redislock: obtain %q: unexpected reply %v", resource, res)
	}
	if res[0] == 0 {
		remaining := time.Duration(max(res[1], 0)) * time.Millisecond
		delay := c.busyDelay
		if remaining > 0 && remaining < delay {
			delay = remaining
		}
		return nil, sdk.RetryAfter(&BusyError{Resource: resource, Remaining: remaining}, delay)
	}
	return &Lock{c: c, resource: resource, key: key, owner: owner, token: res[1], ttl: c.ttl}, nil
}

// Extend resets the lock's lifetime to its TTL from now. It returns an error
// wrapping [ErrLockLost] when the lock is no longer ours; other errors
// (network) leave the question open.
func (l *Lock) Extend(ctx context.Context) error {
	n, err := extendScript.Run(ctx, l.c.rdb, []string{l.key}, l.owner, l.ttl.Milliseconds()).Int64()
	if err != nil {
		return l.c.wrap(ctx, "extend", l.resource, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %q (token %d)", ErrLockLost, l.resource, l.token)
	}
	return nil
}

// Release deletes the lock if it is still ours. It returns an error wrapping
// [ErrLockLost] when it was not (it had expired, and perhaps another holder
// took it): whatever the holder did after that point was not protected by
// the lock. Releasing twice reports ErrLockLost the second time.
//
// A Release whose outcome is unknown (a network error, ctx ending mid-call)
// may be called again: when the first call did delete the lock, the second
// reports success, as the first would have.
//
// A ctx already done when Release is called (a deferred Release in a job
// cancelled by its timeout or a shutdown) does not stop it: a lock left
// behind would block every other holder for the rest of its TTL. Release
// then runs on a context of its own, ctx's values without its
// cancellation, bounded by a second (as [Client.Obtain]'s clean-up is).
func (l *Lock) Release(ctx context.Context) error {
	_, err := l.release(ctx)
	return err
}

// release is Release; earlier reports that the lock had been released by an
// earlier call, whose caller got a network error, rather than by this one.
func (l *Lock) release(ctx context.Context) (earlier bool, err error) {
	if !l.released.CompareAndSwap(false, true) {
		return false, l.alreadyReleased()
	}
	if ctx.Err() != nil { // go-redis would not even send the script
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
		defer cancel()
	}
	call := l.releases.Add(1)
	n, err := releaseScript.Run(ctx, l.c.rdb, []string{l.key, l.key + ":released:" + l.owner}, l.owner, l.ttl.Milliseconds(), call).Int64()
	if err != nil {
		l.released.Store(false) // unknown outcome: the caller may try again
		return false, l.c.wrap(ctx, "release", l.resource, err)
	}
	if n == 0 {
		return false, fmt.Errorf("%w: %q (token %d) had expired at release", ErrLockLost, l.resource, l.token)
	}
	return n == 2, nil
}

func (l *Lock) alreadyReleased() error {
	return fmt.Errorf("%w: %q (token %d) already released", ErrLockLost, l.resource, l.token)
}

// Run takes the lock on resource, runs fn while a watchdog extends the lock
// every ExtendEvery, and releases the lock when fn returns or panics (the
// panic then goes on up the stack).
//
// The watchdog keeps extending until fn returns, even after ctx is done: the
// caller's cancellation (a job timeout, a shutdown) reaches fn through its
// context, and fn, while it finishes (say, a commit under
// context.WithoutCancel), still holds the lock. fn's context is cancelled
// with cause [ErrLockLost] (see context.Cause) when an extension finds the
// lock gone, or when extensions keep failing, or hang, until the lock's
// expiry passes; fn should then stop. (If ctx was done first, fn's context
// keeps ctx's cause.) When the lock was lost before fn returned, or found
// expired at release, Run returns an error wrapping ErrLockLost (joined with
// fn's own error, when fn failed for another reason): the work ran partly
// unprotected, so the job should be retried and its idempotency key decide.
// A release that fails otherwise (Redis unreachable) does not fail Run when
// fn returned before the lock's last confirmed expiry: the work was
// protected, and the lock expires by itself; when fn returned later, Run
// returns the release's error. A fn that releases the lock itself gives up
// its protection for the rest of its work: Run then returns ErrLockLost,
// also when fn's Release got a network error after Redis had released it.
// A busy resource gives the sdk.RetryAfter error of [Client.Obtain] without
// calling fn.
func (c *Client) Run(ctx context.Context, resource string, fn func(ctx context.Context, l *Lock) error) (err error) {
	start := time.Now()
	l, err := c.Obtain(ctx, resource)
	if err != nil {
		return err
	}
	workCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	done := make(chan struct{})
	var (
		lost       error     // set by the watchdog before done is closed
		validUntil time.Time // likewise: the lock is certainly ours until then
	)
	go func() {
		defer close(done)
		validUntil, lost = l.watch(ctx, start, stop, cancel)
	}()
	var (
		fnErr      error
		fnReturned time.Time
	)
	returned := false
	// Deferred, so that a panicking fn releases the lock too: a lock left
	// behind blocks the next holder for a whole TTL. Nothing is recovered:
	// the panic goes on once the lock is released.
	defer func() {
		close(stop)
		<-done
		// Release even when ctx is done.
		relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttl)
		defer relCancel()
		earlier, relErr := l.release(relCtx)
		if earlier {
			// fn released the lock (its call got a network error, but
			// Redis ran it): what fn did after that was unprotected, as
			// when its release is answered and this one comes second.
			relErr = l.alreadyReleased()
		}
		switch {
		case relErr == nil || lost != nil:
		case returned && !errors.Is(relErr, ErrLockLost) && fnReturned.Before(validUntil):
			// The release failed (Redis unreachable) but fn returned
			// while the lock was certainly ours: its work was
			// protected. The lock, if still there, expires by itself.
		default:
			lost = relErr
		}
		if !returned {
			return // fn panicked (or called runtime.Goexit)
		}
		switch {
		case lost == nil:
			err = fnErr
		case fnErr == nil || errors.Is(fnErr, context.Canceled):
			err = lost
		default:
			err = errors.Join(fnErr, lost)
		}
	}()
	fnErr = fn(workCtx, l)
	fnReturned = time.Now()
	returned = true
	return nil
}

// watch extends l until stop is closed, whether or not ctx is done (ctx only
// carries values to the Redis calls). It cancels the work with ErrLockLost,
// and returns that error, when the lock is gone or can no longer be confirmed
// before it expires; it returns nil when stopped first. obtained is a time at
// or before the acquisition: the lock is certainly ours until obtained+TTL,
// and after each extension until (time sent)+TTL; watch returns that time
// as it last stood.
//
// Each extension runs with a deadline at the lock's expiry, and the watchdog
// does not wait for its answer past that point either (a client may not
// honour the deadline in mid-call): the work learns of the loss on time. An
// extension still in flight is waited for before watch returns.
func (l *Lock) watch(ctx context.Context, obtained time.Time, stop <-chan struct{}, cancel context.CancelCauseFunc) (time.Time, error) {
	base := context.WithoutCancel(ctx)
	validUntil := obtained.Add(l.ttl)
	every := l.c.extendEvery
	timer := time.NewTimer(every)
	defer timer.Stop()
	expired := func() error {
		err := fmt.Errorf("%w: %q (token %d): not extended before expiry", ErrLockLost, l.resource, l.token)
		cancel(err)
		return err
	}
	for {
		select {
		case <-stop:
			return validUntil, nil
		case <-timer.C:
		}
		sent := time.Now()
		if !sent.Before(validUntil) {
			return validUntil, expired()
		}
		extCtx, extCancel := context.WithDeadline(base, validUntil)
		result := make(chan error, 1)
		go func() { result <- l.Extend(extCtx) }()
		expiry := time.NewTimer(time.Until(validUntil))
		var err error
		select {
		case err = <-result:
			expiry.Stop()
			extCancel()
		case <-expiry.C: // no answer before the lock expired
			lost := expired()
			extCancel()
			<-result
			return validUntil, lost
		case <-stop:
			expiry.Stop()
			extCancel()
			<-result
			return validUntil, nil
		}
		switch {
		case err == nil:
			validUntil = sent.Add(l.ttl)
			timer.Reset(every)
		case errors.Is(err, ErrLockLost):
			cancel(err)
			return validUntil, err
		default:
			// Network trouble: try again soon, give up at expiry.
			wait := min(every/4, time.Until(validUntil))
			timer.Reset(max(wait, 0))
		}
	}
}

// key returns the lock key of resource: "<prefix>{<resource>}", whose hash
// tag on Redis Cluster is the resource (or its part before a "}"), so the
// lock's other keys, which extend it, land in its slot.
//
// A resource starting with "}" would close the tag at once; Redis Cluster
// ignores an empty tag and hashes each key whole, so the keys of one script
// would fall in different slots (CROSSSLOT, on every call). Such a resource
// is written in hex instead, with a "~" after the tag: "<prefix>{<hex>}~".
// No other resource's key ends that way (a lock key in the plain form ends
// in "}", its counter in "}:fence", its release markers in "}:released:"
// and hex digits), so two names never share a key; names not starting with
// "}" keep their keys.
func (c *Client) key(resource string) string {
	if strings.HasPrefix(resource, "}") {
		return c.prefix + "{" + hex.EncodeToString([]byte(resource)) + "}~"
	}
	return c.prefix + "{" + resource + "}"
}

func (c *Client) wrap(ctx context.Context, op, resource string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("redislock: %s %q: %w", op, resource, err)
}

// abandonTimeout bounds the release [Client.abandon] sends, and a Release
// called with its ctx already done.
const abandonTimeout = time.Second

// abandon releases, as far as it can, a lock an Obtain may have taken
// without learning it: the call failed (its reply lost on a connection cut,
// with no retry left, or ctx ended mid-call) after Redis may have run the
// script. Left alone, such a lock is held by nobody for a whole TTL and
// every Obtain of the resource meanwhile is busy. The release is fenced by
// the owner token, new for this Obtain, so it deletes nothing of anyone
// else's; it runs on a context of its own (ctx may be over), bounded by
// abandonTimeout, and its outcome is ignored: at worst the lock expires.
func (c *Client) abandon(ctx context.Context, key, owner string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	defer cancel()
	_ = releaseScript.Run(rctx, c.rdb, []string{key, key + ":released:" + owner}, owner, c.ttl.Milliseconds(), 1).Err()
}

func newOwner() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("redislock: owner token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
