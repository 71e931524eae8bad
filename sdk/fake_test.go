package sdk_test

import (
	"context"
	"sync"
	"time"

	"github.com/berthq/berth/sdk"
)

// fakeDelivery records how it was settled. It stands in for a broker in the
// Worker's unit tests, where failure paths (refused extensions, settlement
// errors) must happen on demand; the conformance suite runs real brokers.
type fakeDelivery struct {
	msg      *sdk.Message
	attempt  int
	release  bool // implements Releaser
	extendFn func() error

	mu       sync.Mutex
	actions  []string
	delay    time.Duration
	cause    error
	extended int
	settled  chan struct{}
}

func newFake(attempt int, typ string) *fakeDelivery {
	return &fakeDelivery{msg: &sdk.Message{ID: sdk.NewID(), Type: typ}, attempt: attempt, settled: make(chan struct{}, 4)}
}

func (f *fakeDelivery) record(a string, d time.Duration, cause error) error {
	f.mu.Lock()
	f.actions = append(f.actions, a)
	f.delay, f.cause = d, cause
	f.mu.Unlock()
	f.settled <- struct{}{}
	return nil
}

func (f *fakeDelivery) Message() *sdk.Message         { return f.msg }
func (f *fakeDelivery) Attempt() int                  { return f.attempt }
func (f *fakeDelivery) Queue() string                 { return "q" }
func (f *fakeDelivery) Ack(ctx context.Context) error { return f.record("ack", 0, nil) }
func (f *fakeDelivery) Retry(ctx context.Context, d time.Duration, cause error) error {
	return f.record("retry", d, cause)
}
func (f *fakeDelivery) DeadLetter(ctx context.Context, cause error) error {
	return f.record("dead_letter", 0, cause)
}
func (f *fakeDelivery) ExtendLease(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	f.extended++
	fn := f.extendFn
	f.mu.Unlock()
	if fn != nil {
		return fn()
	}
	return nil
}

func (f *fakeDelivery) Actions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.actions...)
}

// releasable is a fakeDelivery that also implements sdk.Releaser.
type releasable struct{ *fakeDelivery }

func (r releasable) Release(ctx context.Context, d time.Duration) error {
	return r.record("release", d, nil)
}

// fakeSub hands out the deliveries sent on its channel.
type fakeSub struct {
	lease     time.Duration // reported through sdk.LeaseReporter when set
	receiving chan struct{} // signalled at every Receive
	ch        chan sdk.Delivery
	errs      chan error
	flushed   chan struct{}
}

func newFakeSub() *fakeSub {
	return &fakeSub{ch: make(chan sdk.Delivery, 1024), errs: make(chan error, 16), flushed: make(chan struct{}, 1), receiving: make(chan struct{}, 1)}
}

func (s *fakeSub) Receive(ctx context.Context, queue string, max int) ([]sdk.Delivery, error) {
	select {
	case s.receiving <- struct{}{}:
	default:
	}
	select {
	case err := <-s.errs:
		return nil, err
	default:
	}
	select {
	case d := <-s.ch:
		out := []sdk.Delivery{d}
		for len(out) < max {
			select {
			case d := <-s.ch:
				out = append(out, d)
			default:
				return out, nil
			}
		}
		return out, nil
	case err := <-s.errs:
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *fakeSub) Flush(ctx context.Context) error {
	select {
	case s.flushed <- struct{}{}:
	default:
	}
	return nil
}
