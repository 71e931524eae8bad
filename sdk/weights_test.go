package sdk_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/berthq/berth/sdk"
)

// Queue weights adding up past MaxQueueWeights are refused by NewWorker
// with a typed error: before, weights near MaxInt were accepted, and the
// allocator's running sums overflowed and split the slots wrongly. Weights
// adding up to exactly MaxQueueWeights are accepted.
func TestWorkerQueueWeightsOverflowRefused(t *testing.T) {
	b := newMem(t)
	ok := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	for name, qs := range map[string][]sdk.WorkerQueue{
		"maxint and one":  {{Name: "a", Weight: math.MaxInt}, {Name: "b", Weight: 1}},
		"two halves":      {{Name: "a", Weight: math.MaxInt/2 + 1}, {Name: "b", Weight: math.MaxInt/2 + 1}},
		"one past max":    {{Name: "a", Weight: sdk.MaxQueueWeights}, {Name: "b"}}, // 0 counts as 1
		"one weight past": {{Name: "a", Weight: sdk.MaxQueueWeights + 1}},
	} {
		_, err := sdk.NewWorker(b, ok, sdk.WorkerOptions{Queues: qs})
		if !errors.Is(err, sdk.ErrInvalidOptions) || !errors.Is(err, sdk.ErrInvalidQueue) {
			t.Errorf("%s: NewWorker = %v, want ErrInvalidOptions and ErrInvalidQueue", name, err)
		}
		if _, err := sdk.CheckConfig(b, sdk.WorkerOptions{Queues: qs}); err == nil {
			t.Errorf("%s: CheckConfig accepted the weights", name)
		}
	}
	if _, err := sdk.NewWorker(b, ok, sdk.WorkerOptions{Queues: []sdk.WorkerQueue{
		{Name: "a", Weight: sdk.MaxQueueWeights - 2}, {Name: "b", Weight: 1}, {Name: "c"},
	}}); err != nil {
		t.Fatalf("weights adding up to MaxQueueWeights: %v", err)
	}
}
