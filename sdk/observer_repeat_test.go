package sdk_test

import (
	"context"
	"errors"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// countingObserver is a pointer Observer; listObserver a value one that is
// not comparable (== on two of them in interfaces panics).
type countingObserver struct{ n int }

func (c *countingObserver) Start(ctx context.Context, _ sdk.Delivery) context.Context {
	c.n++
	return ctx
}

func (c *countingObserver) Settled(context.Context, sdk.Delivery, sdk.Settlement) {}

type listObserver struct{ seen []string }

func (l listObserver) Start(ctx context.Context, _ sdk.Delivery) context.Context {
	_ = len(l.seen)
	return ctx
}
func (l listObserver) Settled(context.Context, sdk.Delivery, sdk.Settlement) {}

// TestNewWorkerRefusesAnObserverListedTwice: the same Observer (pointer)
// twice in WorkerOptions.Observers would see every delivery twice;
// NewWorker refuses it with ErrInvalidOptions. Distinct pointers, and value
// Observers that cannot be compared, are accepted without panicking.
func TestNewWorkerRefusesAnObserverListedTwice(t *testing.T) {
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	a, c := &countingObserver{}, &countingObserver{}
	if _, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: "q", Observers: []sdk.Observer{a, c, a}}); !errors.Is(err, sdk.ErrInvalidOptions) {
		t.Errorf("an Observer listed twice: err %v, want ErrInvalidOptions", err)
	}
	for _, obs := range [][]sdk.Observer{{a, c}, {listObserver{}, listObserver{}}} {
		if _, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: "q", Observers: obs}); err != nil {
			t.Errorf("Observers %T: %v", obs, err)
		}
	}
}
