package sdk_test

import (
	"context"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// newFake returns a recording delivery of a new message of type typ at
// attempt, from queue "q". It is a Releaser; f.WithoutRelease() is the same
// delivery without Release, as on SQS.
func newFake(attempt int, typ string, opts ...berthtest.Option) *berthtest.Delivery {
	opts = append([]berthtest.Option{berthtest.Attempt(attempt), berthtest.Queue("q")}, opts...)
	return berthtest.NewDelivery(&sdk.Message{ID: sdk.NewID(), Type: typ}, opts...)
}

// failExtend makes every lease extension return err.
func failExtend(err error) berthtest.Option {
	return berthtest.OnExtend(func(context.Context, time.Duration) error { return err })
}

// actions lists the settlement calls f received, by action.
func actions(f *berthtest.Delivery) []string {
	var out []string
	for _, c := range f.Calls() {
		out = append(out, string(c.Action))
	}
	return out
}

// first returns f's first settlement call.
func first(f *berthtest.Delivery) berthtest.Call {
	c, _ := f.Settlement()
	return c
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
