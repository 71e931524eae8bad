// Package berthtest is berth's test kit for applications: test a handler
// through the Worker's real settlement rules without a broker ([Work]), fake
// a delivery that records its settlement ([Delivery]), run a Worker on an
// in-memory broker and wait for its settlements ([Memory], [StartWorker],
// [Recorder]), and test code that publishes asynchronously against a
// publisher whose confirms the test gives ([AsyncPublisher]). Package
// berthtest/pgtest gives each test its own PostgreSQL schema.
//
// It imports only package sdk and the in-memory broker, so a test binary
// that uses it pulls in no network client and no container library.
//
//	func TestCharge(t *testing.T) {
//		m, _ := sdk.NewJob(ChargeOrder{OrderID: "o1"})
//		res := berthtest.Work(t, router, m)
//		if !res.Acked() {
//			t.Fatalf("charge: %s (%v, refused: %v)", res.Action, res.Cause, res.Err)
//		}
//	}
package berthtest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// DefaultQueue is the queue of a [Delivery] made without the [Queue] option
// when no [WorkerOptions] name a queue.
const DefaultQueue = "berthtest"

// WaitTimeout bounds how long the Wait helpers wait before failing the test
// when no timeout of their own was set, and how long [Work] lets a handler
// run. Prefer [Recorder.SetWaitTimeout] and
// [Delivery.SetWaitTimeout] to changing it: it is shared by every test of
// the package, so a test that writes it races with tests running under
// t.Parallel (and changes their timeouts). It is kept for compatibility.
var WaitTimeout = 30 * time.Second

// waitTimeout is d, or [WaitTimeout] when d is not positive.
func waitTimeout(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return WaitTimeout
}

// Option configures [Work] and [NewDelivery].
type Option func(*config)

type config struct {
	attempt   int
	queue     string
	queueSet  bool // by the Queue option
	extend    func(context.Context, time.Duration) error
	noRelease bool
	worker    sdk.WorkerOptions
}

func newConfig(opts []Option) config {
	c := config{attempt: 1}
	for _, o := range opts {
		o(&c)
	}
	if !c.queueSet {
		// A Worker only gets deliveries of the queues it consumes.
		switch {
		case c.worker.Queue != "":
			c.queue = c.worker.Queue
		case len(c.worker.Queues) > 0:
			c.queue = c.worker.Queues[0].Name
		default:
			c.queue = DefaultQueue
		}
	}
	return c
}

// Attempt makes the delivery's Attempt() n (1, the first delivery, by
// default): a handler run at attempt MaxAttempts shows what the Worker does
// with a last failure.
func Attempt(n int) Option { return func(c *config) { c.attempt = max(n, 1) } }

// Queue makes the delivery come from queue. Without it, the delivery comes
// from the queue of the [WorkerOptions] (Queue, or the first of Queues), as
// a Worker's deliveries do, else from [DefaultQueue].
func Queue(queue string) Option { return func(c *config) { c.queue, c.queueSet = queue, true } }

// OnExtend makes ExtendLease return what fn returns: a refused extension
// ([sdk.ErrLeaseLost]) or a failing one.
func OnExtend(fn func(ctx context.Context, by time.Duration) error) Option {
	return func(c *config) { c.extend = fn }
}

// WithoutRelease makes [Work] deliver through a delivery that cannot be
// released (as on SQS), so the Worker retries where it would release.
func WithoutRelease() Option { return func(c *config) { c.noRelease = true } }

// WorkerOptions makes [Work] settle with these options: the retry policy
// (Retry, RetryByType), Timeout, Middleware, Observers, Logger. Queue
// defaults to the delivery's queue (unless Queues is set: the options of a
// Worker that consumes several queues are taken as they are), Logger to one
// that discards, Rand to a fixed seed (so backoff delays are the same on
// every run). Without the [Queue] option, the delivery comes from Queue (or
// the first of Queues).
func WorkerOptions(o sdk.WorkerOptions) Option { return func(c *config) { c.worker = o } }

// Result is what the Worker did with one delivery in [Work].
type Result struct {
	// Settlement is the Worker's account of it: Action (ack, retry,
	// dead_letter, release), Delay, the handler's error (Cause) and its
	// Class, and Err when the delivery refused the settlement.
	sdk.Settlement
	// Reason is the dead-letter reason a broker would store
	// ([sdk.SanitizeReason] of the cause), "" unless dead-lettered
	// ([Result.DeadLettered]).
	Reason string
	// Delivery is the fake delivery the handler ran on.
	Delivery *Delivery
}

// Acked reports whether the job was acked (done).
//
// Acked, Retried and DeadLettered report a settlement that took: one the
// delivery refused (Err: the handler had settled the delivery itself, its
// lease was lost) did nothing, as on a broker, and is none of them; Action
// still says what the Worker tried.
func (r Result) Acked() bool { return r.Action == sdk.ActionAck && r.Err == nil }

// Retried reports whether the job was handed back to run again: retried
// (an attempt consumed) or released (none consumed).
func (r Result) Retried() bool {
	return (r.Action == sdk.ActionRetry || r.Action == sdk.ActionRelease) && r.Err == nil
}

// DeadLettered reports whether the job was moved to the dead-letter queue.
func (r Result) DeadLettered() bool { return r.Action == sdk.ActionDeadLetter && r.Err == nil }

// Work runs h on one delivery of m through the Worker's own settlement code
// ([sdk.Worker.Process]: middleware, panic recovery, retry policy, handler
// timeout) and returns what the Worker did. m is first prepared as a
// publish would ([sdk.Prepare]: ID and correlation ID filled, names and
// headers checked); an invalid message fails the test.
//
// It needs no broker: the delivery is a [Delivery]. A Result's Delay for a
// retry is the backoff the policy gives at the delivery's attempt; set
// [Attempt] to test the last attempt.
//
// The handler runs under t.Context() (in a Cleanup function, under a
// context of its own), bounded by [WaitTimeout]: a handler that waits on
// its context for something the test never gives is stopped when the test
// ends or at that bound, rather than at the job's timeout (30 minutes by
// default) — as a Worker's shutdown stops it: its context is cancelled
// with cause [sdk.ErrShutdown] and the delivery released. A handler
// stopped at the bound fails the test (with t.Errorf; the Result is still
// returned), whatever the Worker then did with it (a release, a retry
// when the delivery cannot be released, an ack when the handler returned
// nil once stopped). The handler timeout of the WorkerOptions, when shorter,
// applies first.
func Work(t testing.TB, h sdk.Handler, m *sdk.Message, opts ...Option) Result {
	t.Helper()
	c := newConfig(opts)
	parent := t.Context()
	if parent == nil || parent.Err() != nil {
		// nil: a testing.T not made by package testing (an Example's).
		// Done: Work called from a Cleanup function, which runs after the
		// test's context ends; WaitTimeout still bounds the handler.
		parent = context.Background()
	}
	bound := WaitTimeout
	ctx, cancel := context.WithTimeoutCause(parent, bound, errWorkBound)
	defer cancel()
	if err := sdk.Prepare(ctx, c.queue, m, 0); err != nil {
		t.Fatalf("berthtest: Work: %v", err)
	}
	d := NewDelivery(m, opts...)
	var sd sdk.Delivery = d
	if c.noRelease {
		sd = d.WithoutRelease()
	}
	o := c.worker
	if o.Queue == "" && len(o.Queues) == 0 { // both set: NewWorker refuses them
		o.Queue = c.queue
	}
	if o.Logger == nil {
		o.Logger = discard
	}
	if o.Rand == nil {
		o.Rand = rand.New(rand.NewPCG(1, 2))
	}
	// hung: the handler (its middleware included) returned only once the
	// bound had passed. Read when it returns, not after Process: what
	// follows it (an observer's Settled, the settlement) may outlast the
	// bound without the handler having hung.
	var hung atomic.Bool
	o.Middleware = append([]sdk.Middleware{func(next sdk.Handler) sdk.Handler {
		return sdk.HandlerFunc(func(hctx context.Context, d sdk.Delivery) error {
			defer func() { hung.Store(errors.Is(context.Cause(ctx), errWorkBound)) }()
			return next.Handle(hctx, d)
		})
	}}, o.Middleware...)
	w, err := sdk.NewWorker(noSubscriber{}, h, o)
	if err != nil {
		t.Fatalf("berthtest: Work: %v", err)
	}
	res := Result{Settlement: w.Process(ctx, sd), Delivery: d}
	if hung.Load() {
		// Whatever the Worker then did: released, retried (a delivery
		// that cannot be released) or acked (a handler that returned nil
		// once stopped), the handler hung until the bound.
		t.Errorf("berthtest: Work: the handler of a %q job still ran after %s (WaitTimeout): it was stopped, its delivery settled as %s", m.Type, bound, res.Action)
	}
	if res.DeadLettered() && res.Cause != nil {
		res.Reason = sdk.SanitizeReason(res.Cause.Error())
	}
	return res
}

// errWorkBound is the cause of the end of [Work]'s context at WaitTimeout.
var errWorkBound = errors.New("berthtest: Work: WaitTimeout reached")

// noSubscriber is the Subscriber of the Worker that [Work] uses only to
// process: it is never asked to receive.
type noSubscriber struct{}

func (noSubscriber) Receive(ctx context.Context, _ string, _ int) ([]sdk.Delivery, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))
