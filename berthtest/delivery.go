package berthtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// Call is one settlement call a [Delivery] received.
type Call struct {
	Action sdk.Action    // ack, retry, dead_letter or release
	Delay  time.Duration // for retry and release
	Cause  error         // for retry and dead_letter
	// Err is what the call returned: nil for the settlement,
	// [sdk.ErrAlreadySettled] for a later call, an error wrapping
	// [sdk.ErrLeaseLost] for one after the lease was lost.
	Err error
}

// Delivery is an [sdk.Delivery] (and [sdk.Releaser]) that records how it was
// settled instead of talking to a broker. It keeps the contract's rules: the
// first settlement wins, a later one returns [sdk.ErrAlreadySettled] (and is
// recorded, so a test can see that the Worker settled twice), a settlement
// after ExtendLease returned an error wrapping [sdk.ErrLeaseLost] is refused
// with such an error and settles nothing (it is recorded too). A dead
// letter's Call keeps the cause as given; [Result.Reason] is what a broker
// would store of it ([sdk.SanitizeReason]).
//
// Use it to test handlers and middleware without a broker, and to force
// the failure paths a real broker cannot produce on demand (a refused lease
// extension: [OnExtend]). Its methods may be called concurrently.
type Delivery struct {
	msg     *sdk.Message
	attempt int
	queue   string
	extend  func(ctx context.Context, d time.Duration) error

	mu       sync.Mutex
	calls    []Call
	settled  bool
	lost     error // the refusal that lost the lease, nil while it holds
	extended int
	done     chan struct{}
	timeout  time.Duration // of Wait; 0: WaitTimeout
}

var (
	_ sdk.Delivery = (*Delivery)(nil)
	_ sdk.Releaser = (*Delivery)(nil)
)

// NewDelivery returns a Delivery of m: attempt 1 on queue [DefaultQueue]
// unless opts say otherwise ([Attempt], [Queue] or the queue of
// [WorkerOptions], [OnExtend]). m is used as it is; [Work] prepares it
// first ([sdk.Prepare]).
func NewDelivery(m *sdk.Message, opts ...Option) *Delivery {
	c := newConfig(opts)
	return &Delivery{msg: m, attempt: c.attempt, queue: c.queue, extend: c.extend, done: make(chan struct{})}
}

// Message returns the delivered message.
func (d *Delivery) Message() *sdk.Message { return d.msg }

// Attempt returns the attempt given by the [Attempt] option, 1 by default.
func (d *Delivery) Attempt() int { return d.attempt }

// Queue returns the queue given by the [Queue] option, else the queue of
// the [WorkerOptions], else [DefaultQueue].
func (d *Delivery) Queue() string { return d.queue }

// Ack records an ack.
func (d *Delivery) Ack(context.Context) error { return d.record(Call{Action: sdk.ActionAck}) }

// Retry records a retry after delay.
func (d *Delivery) Retry(_ context.Context, delay time.Duration, cause error) error {
	return d.record(Call{Action: sdk.ActionRetry, Delay: delay, Cause: cause})
}

// DeadLetter records a dead letter.
func (d *Delivery) DeadLetter(_ context.Context, cause error) error {
	return d.record(Call{Action: sdk.ActionDeadLetter, Cause: cause})
}

// Release records a release after delay (no attempt consumed).
func (d *Delivery) Release(_ context.Context, delay time.Duration) error {
	return d.record(Call{Action: sdk.ActionRelease, Delay: delay})
}

// ExtendLease counts the extension and returns what the [OnExtend] function
// returns (nil without one); after the settlement it returns
// [sdk.ErrAlreadySettled], as a broker does. Once it returned an error
// wrapping [sdk.ErrLeaseLost], the lease stays lost: later extensions and
// settlements return an error wrapping it too.
func (d *Delivery) ExtendLease(ctx context.Context, by time.Duration) error {
	d.mu.Lock()
	d.extended++
	settled, lost := d.settled, d.lost
	fn := d.extend
	d.mu.Unlock()
	switch {
	case settled:
		return sdk.ErrAlreadySettled
	case lost != nil:
		return lost
	case fn == nil:
		return nil
	}
	err := fn(ctx, by)
	if errors.Is(err, sdk.ErrLeaseLost) {
		d.mu.Lock()
		if !d.settled && d.lost == nil {
			d.lost = err
		}
		d.mu.Unlock()
	}
	return err
}

func (d *Delivery) record(c Call) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.settled:
		c.Err = sdk.ErrAlreadySettled
	case d.lost != nil:
		c.Err = fmt.Errorf("berthtest: %s of message %q after the lease was lost: %w", c.Action, d.msg.ID, d.lost)
	default:
		d.settled = true
		close(d.done)
	}
	d.calls = append(d.calls, c)
	return c.Err
}

// Calls returns every settlement call received, in order, refused ones
// included (Call.Err); a correct Worker makes at most one, and none after
// the lease was lost.
func (d *Delivery) Calls() []Call {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Call(nil), d.calls...)
}

// Settlement returns the settlement call (the first one not refused), and
// false while there is none.
func (d *Delivery) Settlement() (Call, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.calls {
		if c.Err == nil {
			return c, true
		}
	}
	return Call{}, false
}

// Done is closed at the settlement (not at a refused call).
func (d *Delivery) Done() <-chan struct{} { return d.done }

// SetWaitTimeout makes [Delivery.Wait] wait up to d before failing the
// test, instead of [WaitTimeout]; 0 goes back to WaitTimeout. Unlike a
// change of WaitTimeout, it is safe in a test under t.Parallel.
func (d *Delivery) SetWaitTimeout(timeout time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.timeout = timeout
}

// Wait waits up to [WaitTimeout] (or [Delivery.SetWaitTimeout]) for the
// settlement and returns it; it fails the test when none comes.
func (d *Delivery) Wait(t testing.TB) Call {
	t.Helper()
	d.mu.Lock()
	timeout := waitTimeout(d.timeout)
	d.mu.Unlock()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-d.done:
	case <-timer.C:
		t.Fatalf("berthtest: delivery %q not settled within %s", d.msg.ID, timeout)
	}
	c, _ := d.Settlement()
	return c
}

// Extensions returns how many times ExtendLease was called.
func (d *Delivery) Extensions() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.extended
}

// WithoutRelease returns d seen as a delivery that cannot be released, as
// an SQS delivery: the Worker falls back to Retry where it would release.
// Settlements still reach d.
func (d *Delivery) WithoutRelease() sdk.Delivery { return noRelease{d} }

type noRelease struct{ d *Delivery }

func (n noRelease) Message() *sdk.Message         { return n.d.Message() }
func (n noRelease) Attempt() int                  { return n.d.Attempt() }
func (n noRelease) Queue() string                 { return n.d.Queue() }
func (n noRelease) Ack(ctx context.Context) error { return n.d.Ack(ctx) }
func (n noRelease) Retry(ctx context.Context, delay time.Duration, cause error) error {
	return n.d.Retry(ctx, delay, cause)
}
func (n noRelease) DeadLetter(ctx context.Context, cause error) error {
	return n.d.DeadLetter(ctx, cause)
}
func (n noRelease) ExtendLease(ctx context.Context, by time.Duration) error {
	return n.d.ExtendLease(ctx, by)
}
